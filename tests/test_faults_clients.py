"""The workload client processes of the fault runs (oncelog.faults.clients, issue 31): each kind
(our client, confluent-kafka, Kafka's Java client) and role (queue, copier, drain) runs as a
process of its own against a 3-broker oncelog cluster and writes its own history file, which
these tests check themselves: well formed, every acknowledged send read exactly once by the
drain at its offset, nothing of an aborted transaction read, what the consumers polled is what
the log holds, and the copier's output holds every input value exactly once. A client SIGKILLed
mid-transaction and restarted under another name with the same transactional.id fences the
dead one, and its open transaction never becomes visible."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, TopicPartition
from oncelog.faults.clients import command, java_command
from oncelog.harness.local_cluster import LocalCluster
from oncelog.harness.zookeeper import ZooKeeperServer

pytest.importorskip("kazoo")  # the brokers need it

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SETTINGS = {"transaction.state.log.num.partitions": 3, "offsets.topic.num.partitions": 3,
            "group.initial.rebalance.delay.ms": 0, "zookeeper.session.timeout.ms": 4000}
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture(scope="module")
def cluster(zookeeper_server: ZooKeeperServer,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("faults-clients") / "cluster", 3,
                     zookeeper=f"{zookeeper_server.connect_string}/t-{uuid.uuid4().hex[:10]}",
                     broker_settings=SETTINGS, die_with_parent=True)
    with c:
        c.start()
        yield c


def topics(cluster: LocalCluster, partitions: int, *names: str) -> list[str]:
    """Topics (replicated three times, two in sync for acks=all) of ``partitions``; their
    names, made unique."""
    made = [f"{name}-{uuid.uuid4().hex[:6]}" for name in names]
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(t, partitions, replication_factor=3,
                                      config={"min.insync.replicas": "2"}) for t in made])
    for t in made:
        for p in range(partitions):
            cluster.wait_for_isr(t, p, 3, 30)
    return made


def keys_of(topic: str, partitions: int) -> list[str]:
    return [f"{topic}:{p}" for p in range(partitions)]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def start(argv: list[str], work: Path, name: str) -> subprocess.Popen[bytes]:
    with open(work / f"{name}.err", "ab") as err:
        return subprocess.Popen(argv, stdout=err, stderr=err, env=env(), cwd=work)


def finish(procs: dict[str, subprocess.Popen[bytes]], work: Path, timeout: float = 90) -> None:
    for name, p in procs.items():
        code = p.wait(timeout)
        assert code == 0, f"{name} exited with {code}:\n" + \
            (work / f"{name}.err").read_text()[-3000:]


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def python_client(kind: str, role: str, name: str, bootstrap: str, work: Path,
                  **options: Any) -> list[str]:
    return command(kind, role, process=name, bootstrap=bootstrap,
                   history=work / f"history-{name}.jsonl", **options)


# -- the checks ---------------------------------------------------------------------------------


def check_well_formed(ops: list[dict[str, Any]], complete: bool = True) -> None:
    """Per process: meta lines, then invoke / completion pairs of the same f, times not going
    back; with ``complete`` no invoke is left open."""
    pending: dict[str, Any] | None = None
    last = 0
    for op in ops:
        assert op["time"] >= last, op
        last = op["time"]
        if op["type"] == "meta":
            continue
        if op["type"] == "invoke":
            assert pending is None, (pending, op)
            assert op["f"] in ("send", "poll", "txn", "assign", "subscribe"), op
            pending = op
        else:
            assert op["type"] in ("ok", "fail", "info"), op
            assert pending is not None and pending["f"] == op["f"], (pending, op)
            assert op["txn"] == pending["txn"]
            if op["f"] in ("send", "poll", "txn"):
                assert len(op["value"]) == len(pending["value"]), (pending, op)
                for invoked, done in zip(pending["value"], op["value"], strict=True):
                    assert invoked[0] == done[0]
                    if done[0] == "send":
                        assert done[1] == invoked[1] and done[2][1] == invoked[2], (invoked, done)
                        if op["type"] == "ok":
                            assert isinstance(done[2][0], int) and done[2][0] >= 0, done
            pending = None
    if complete:
        assert pending is None, pending


def sent(ops: list[dict[str, Any]], kind: str) -> list[tuple[str, int, int]]:
    """(key, offset, value) of the sends of the completions of type ``kind``."""
    out = []
    for op in ops:
        if op["type"] == kind and op["f"] in ("send", "txn"):
            out += [(m[1], m[2][0], m[2][1]) for m in op["value"] if m[0] == "send"]
    return out


def polled(ops: list[dict[str, Any]]) -> list[tuple[str, int, Any]]:
    """(key, offset, value) of what the ok operations polled."""
    out = []
    for op in ops:
        if op["type"] == "ok" and op["f"] in ("poll", "txn"):
            for m in op["value"]:
                if m[0] == "poll" and len(m) > 1:
                    out += [(k, o, v) for k, read in m[1].items() for o, v in read]
    return out


def drained(ops: list[dict[str, Any]], keys: list[str]) -> dict[str, dict[int, Any]]:
    """The drain's reads (offset -> value per key), after checking it reached every end and
    read each offset once."""
    end = [op for op in ops if op["type"] == "meta" and op.get("f") == "drain_end"]
    assert len(end) == 1, "no drain_end"
    assert sorted(end[0]["value"]) == sorted(keys)
    for k, e in end[0]["value"].items():
        assert e["reached"] >= e["end"], f"stuck read on {k}: {e}"
    log: dict[str, dict[int, Any]] = {k: {} for k in keys}
    for k, o, v in polled(ops):
        assert o not in log[k], f"{k}@{o} read twice"
        log[k][o] = v
    return log


def check_queue(histories: dict[str, list[dict[str, Any]]], log: dict[str, dict[int, Any]]
                ) -> None:
    """Every acknowledged send read exactly once, at its offset; nothing aborted read; every
    value read was sent (no phantom); what each consumer polled is what the log holds."""
    for k, read in log.items():
        counts = Counter(read.values())
        assert not [v for v, n in counts.items() if n > 1], f"duplicates in {k}"
    everything = [op for ops in histories.values() for op in ops]
    acked = sent(everything, "ok")
    assert acked, "nothing acknowledged"
    where = {(k, v): o for k, read in log.items() for o, v in read.items()}
    for k, o, v in acked:
        assert (k, v) in where, f"lost write: {v} acknowledged in {k}@{o}, never read"
        assert where[(k, v)] == o, f"{v} acknowledged at {k}@{o}, read at {where[(k, v)]}"
    # (a copier sends a value again after an aborted copy of it: only values no ok or info
    # operation sent count)
    aborted = {(k, v) for k, _, v in sent(everything, "fail")} \
        - {(k, v) for kind in ("ok", "info") for k, _, v in sent(everything, kind)}
    assert not aborted & set(where), f"aborted reads: {sorted(aborted & set(where))[:5]}"
    invoked = {(m[1], m[2]) for op in everything if op["type"] == "invoke"
               and op["f"] in ("send", "txn") for m in op["value"] if m[0] == "send"}
    assert set(where) <= invoked, f"values never sent: {sorted(set(where) - invoked)[:5]}"
    for name, ops in histories.items():
        for k, o, v in polled(ops):
            assert log[k].get(o) == v, f"{name} polled {v} at {k}@{o}; the log has {log[k].get(o)}"


def client_meta(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [op for op in ops if op["type"] == "meta" and op.get("f") == "client"
            and "error" not in op]


# -- the tests ----------------------------------------------------------------------------------


def run_mix(cluster: LocalCluster, work: Path,
            clients: dict[str, tuple[list[str], str]], keys: list[str], copies: dict[str, str],
            drains: dict[str, list[str]]) -> None:
    """Start the clients, wait for them, run the drains; check everything."""
    procs = {name: start(argv, work, name) for name, (argv, _) in clients.items()}
    finish(procs, work)
    histories = {name: lines(work / f"history-{name}.jsonl") for name in clients}
    for name, ops in histories.items():
        check_well_formed(ops)
        assert sum(op["type"] == "ok" for op in ops) > 2, f"{name} did nothing"
    finish({name: start(argv, work, name) for name, argv in drains.items()}, work)
    logs = [drained(lines(work / f"history-{name}.jsonl"), keys + list(copies.values()))
            for name in drains]
    for name in drains:
        check_well_formed(lines(work / f"history-{name}.jsonl"))
    assert all(log == logs[0] for log in logs), "the drains read different logs"
    log = logs[0]
    check_queue(histories, log)
    # the copier: every committed input value in its output key exactly once (the copiers
    # ran on after the writers stopped); this fails if a consumer does not rewind after an
    # aborted transaction that polled (KAFKA-17582): the next one skips what it had read
    copied = [op for name, (_, role) in clients.items() if role == "copier"
              for op in histories[name]]
    if copies:
        assert any(op["type"] == "fail" and op["f"] == "txn" and "rewound" in op
                   for op in copied), "no copier transaction aborted after polling"
        for source, target in copies.items():
            assert sorted(log[source].values()) == sorted(log[target].values()), \
                f"{source} -> {target}: missing {set(log[source].values()) - set(log[target].values())}"


def test_python_clients_queue_copier_drain(cluster: LocalCluster, tmp_path: Path) -> None:
    """Our client and confluent-kafka, queue (assign and subscribe) and copier (one group of
    both kinds), at once; then a drain of each kind."""
    q, out = topics(cluster, 2, "queue", "copied")
    keys, outs = keys_of(q, 2), keys_of(out, 2)
    bs = cluster.bootstrap_servers
    common = {"seed": 7, "request_timeout_ms": 3000, "op_timeout": 15}
    clients = {}
    for i, (kind, mode) in enumerate([("oncelog", "assign"), ("oncelog", "subscribe"),
                                      ("confluent", "assign"), ("confluent", "subscribe")], 1):
        name = f"{kind}-{i}"
        clients[name] = (python_client(kind, "queue", name, bs, tmp_path, keys=keys,
                                       duration=3, txn_ratio=0.5, abort_ratio=0.2,
                                       poll_mode=mode, group=f"q-{mode}" if mode == "subscribe"
                                       else None, reassign_every=8, **common), "queue")
    for i, kind in enumerate(["oncelog", "confluent"], 11):
        name = f"copier-{i}"
        clients[name] = (python_client(kind, "copier", name, bs, tmp_path, input=keys,
                                       output=outs, duration=4, abort_ratio=0.3,
                                       poll_mode="subscribe", group="copiers", **common),
                         "copier")
    drains = {f"drain-{i}": python_client(kind, "drain", f"drain-{i}", bs, tmp_path,
                                          keys=keys + outs, timeout=30)
              for i, kind in enumerate(["oncelog", "confluent"], 1)}
    run_mix(cluster, tmp_path, clients, keys, dict(zip(keys, outs, strict=True)), drains)
    kinds = set()
    for name in clients:
        metas = client_meta(lines(tmp_path / f"history-{name}.jsonl"))
        assert metas, name
        kind = metas[0]["kind"]
        kinds.add(kind)
        # ours: transaction version 2 (KIP-890 part 2); librdkafka: version 1
        assert {(m["kind"], m["transaction_version"]) for m in metas} == \
            {(kind, 2 if kind == "oncelog" else 1)}, (name, metas)
    assert kinds == {"oncelog", "confluent"}


@pytest.mark.kafka
def test_java_client_queue_copier_drain(cluster: LocalCluster, tmp_path: Path,
                                        kafka_jars: str) -> None:
    """Kafka's Java client (QueueClient.java): queue with assign and subscribe, a copier, a
    drain; it negotiates transaction version 2 with our brokers."""
    q, out = topics(cluster, 2, "jqueue", "jcopied")
    keys, outs = keys_of(q, 2), keys_of(out, 2)
    bs = cluster.bootstrap_servers
    classes = tmp_path.parent / "queue-client-classes"

    def java(role: str, name: str, **options: Any) -> list[str]:
        return java_command(role, classes=classes, classpath=kafka_jars, process=name,
                            bootstrap=bs, history=tmp_path / f"history-{name}.jsonl",
                            request_timeout_ms=3000, op_timeout=15, seed=3, **options)

    clients = {
        "java-1": (java("queue", "java-1", keys=keys, duration=3, abort_ratio=0.2,
                        poll_mode="assign", reassign_every=8), "queue"),
        "java-2": (java("queue", "java-2", keys=keys, duration=3, abort_ratio=0.2,
                        poll_mode="subscribe", group="jq"), "queue"),
        "java-11": (java("copier", "java-11", input=keys, output=outs, duration=4,
                         abort_ratio=0.3, poll_mode="subscribe", group="jcopiers"), "copier"),
    }
    run_mix(cluster, tmp_path, clients, keys, dict(zip(keys, outs, strict=True)),
            {"drain-1": java("drain", "drain-1", keys=keys + outs, timeout=30)})
    for name in clients:
        metas = client_meta(lines(tmp_path / f"history-{name}.jsonl"))
        assert metas and {(m["kind"], m["transaction_version"]) for m in metas} == {("java", 2)}


def _crash(cluster: LocalCluster, tmp_path: Path, client: Any, drain: Any) -> None:
    """Three processes, one transactional.id. crash-1 holds each transaction open and is
    SIGKILLed once its transaction's sends are in the log. crash-2 starts (fencing it: its
    transaction is aborted at once: the transaction timeout is a minute, and the drain reaches
    every end sooner) and commits; then crash-3 starts beside it and fences it in turn:
    crash-2's next transaction fails, it makes a new producer with the same id and goes on
    until SIGTERM stops it. The dead transaction is never read; the histories pass the
    queue checks."""
    (q,) = topics(cluster, 1, "crash")
    keys = [f"{q}:0"]
    txn_id = f"crash-{uuid.uuid4().hex[:6]}"
    common = {"keys": keys, "transactional_id": txn_id, "txn_ratio": 1, "abort_ratio": 0,
              "transaction_timeout_ms": 60_000, "seed": 1, "poll_mode": "assign"}
    first = start(client("queue", "crash-1", tmp_path, duration=60, txn_hold_ms=60_000,
                         max_txn_ops=2, **common), tmp_path, "crash-1")
    history = tmp_path / "history-crash-1.jsonl"
    try:
        def in_log() -> bool:
            with Consumer(bootstrap_servers=cluster.bootstrap_servers) as c:
                return c.end_offsets([TopicPartition(q, 0)], timeout=10)[TopicPartition(q, 0)] > 0

        wait_until(lambda: history.exists() and any(
            op["type"] == "invoke" and op["f"] == "txn" and any(m[0] == "send"
                                                                for m in op["value"])
            for op in lines(history)), 60, "a transaction that sends")
        wait_until(in_log, 60, "its records in the log")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    dead = lines(history)
    check_well_formed(dead, complete=False)
    assert dead[-1]["type"] == "invoke" and dead[-1]["f"] == "txn", dead[-1]
    open_values = {m[2] for m in dead[-1]["value"] if m[0] == "send"}
    assert open_values
    # the dead client's transaction holds the last stable offset back: a drain now is stuck
    finish({"drain-0": start(drain("drain", "drain-0", tmp_path, keys=keys, timeout=2),
                             tmp_path, "drain-0")}, tmp_path)
    stuck = [op for op in lines(tmp_path / "history-drain-0.jsonl")
             if op.get("f") == "drain_end"][0]["value"][keys[0]]
    assert stuck["reached"] < stuck["end"], stuck

    second = start(client("queue", "crash-2", tmp_path, duration=60, **common), tmp_path,
                   "crash-2")
    try:
        h2 = tmp_path / "history-crash-2.jsonl"
        wait_until(lambda: h2.exists() and sent(lines(h2), "ok"), 60, "crash-2 commits")
        finish({"crash-3": start(client("queue", "crash-3", tmp_path, duration=1, **common),
                                 tmp_path, "crash-3")}, tmp_path)
        def reset_at() -> int | None:
            resets = [m["time"] for m in client_meta(lines(h2)) if m.get("init") == "reset"]
            return resets[0] if resets else None

        reset = wait_until(reset_at, 60, "crash-2, fenced, makes a new producer")
        wait_until(lambda: [op for op in lines(h2) if op["time"] > reset
                            and op["type"] == "ok" and op["f"] == "txn"],
                   60, "crash-2 commits with its new producer")
    finally:
        second.send_signal(signal.SIGTERM)
    finish({"crash-2": second}, tmp_path)
    finish({"drain-1": start(drain("drain", "drain-1", tmp_path, keys=keys, timeout=20),
                             tmp_path, "drain-1")}, tmp_path)
    log = drained(lines(tmp_path / "history-drain-1.jsonl"), keys)
    histories = {"crash-1": dead}
    for name in ("crash-2", "crash-3"):
        histories[name] = lines(tmp_path / f"history-{name}.jsonl")
        check_well_formed(histories[name])
    assert not open_values & set(log[keys[0]].values()), "the dead client's transaction was read"
    check_queue(histories, log)
    fenced = [op for op in histories["crash-2"] if op["f"] == "txn"
              and op["type"] in ("fail", "info")]
    assert fenced, "crash-2 was not fenced"
    firsts = [client_meta(histories[name])[0] for name in ("crash-1", "crash-2", "crash-3")]
    if "producer_epoch" in firsts[0]:  # our client says which epoch it got: higher each time
        assert len({m["producer_id"] for m in firsts}) == 1
        assert firsts[0]["producer_epoch"] < firsts[1]["producer_epoch"] \
            < firsts[2]["producer_epoch"]


@pytest.mark.parametrize("kind", ["oncelog", "confluent"])
def test_a_crashed_clients_transaction_is_fenced_and_never_read(
        cluster: LocalCluster, tmp_path: Path, kind: str) -> None:
    bs = cluster.bootstrap_servers

    def client(role: str, name: str, work: Path, **o: Any) -> list[str]:
        return python_client(kind, role, name, bs, work, **o)

    _crash(cluster, tmp_path, client, client)


@pytest.mark.kafka
def test_a_crashed_java_clients_transaction_is_fenced_and_never_read(
        cluster: LocalCluster, tmp_path: Path, kafka_jars: str) -> None:
    bs = cluster.bootstrap_servers
    classes = tmp_path.parent / "queue-client-classes"

    def client(role: str, name: str, work: Path, **o: Any) -> list[str]:
        return java_command(role, classes=classes, classpath=kafka_jars, process=name,
                            bootstrap=bs, history=work / f"history-{name}.jsonl", **o)

    def drain(role: str, name: str, work: Path, **o: Any) -> list[str]:  # (one JVM less)
        return python_client("oncelog", role, name, bs, work, **o)

    _crash(cluster, tmp_path, client, drain)


def test_command_builds_the_flags_the_client_parses() -> None:
    argv = command("oncelog", "copier", process="c-1", bootstrap="h:1", history="f.jsonl",
                   input=["a:0", "a:1"], output=["b:0", "b:1"], txn_ratio=0.5,
                   poll_mode="subscribe", transactional_id="t", group=None)
    assert argv[:3] == [sys.executable, "-m", "oncelog.faults.clients"]
    assert argv[argv.index("--input") + 1] == "a:0,a:1"
    assert "--group" not in argv
    from oncelog.faults.clients.__main__ import parser, resolve

    args = resolve(parser().parse_args(argv[3:]))
    assert (args.input, args.output, args.index, args.group, args.transactional_id) == \
        (["a:0", "a:1"], ["b:0", "b:1"], 1, "copier-group", "t")
    queue = resolve(parser().parse_args(command("confluent", "queue", process="q-4",
                                                bootstrap="h:1", history="f",
                                                keys=["a:0"])[3:]))
    assert (queue.group, queue.transactional_id, queue.index) == ("q-4", "q-4", 4)
    with pytest.raises(TypeError):
        command("oncelog", "queue", process="q-1", bootstrap="h:1", history="f", nope=1)

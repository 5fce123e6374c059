"""Replication in cluster mode through real faults: broker processes
(oncelog.harness.local_cluster's LocalCluster) on a real ZooKeeper (Debian's, one for the module;
each test's cluster under a chroot of its own), replication factor 3 with min.insync.replicas 2.

Every test keeps a history of acknowledged writes (value -> partition, offset) and ends by
reading every partition to its end: no acknowledged write lost (it is at its acknowledged
offset), none twice (idempotent producers), offsets increasing. Where a broker came back, the
replicas' logs are compared batch by batch on disk after a clean stop: a broker that held records
the new leader did not have truncated them.

Sessions are short (2 s): failover waits for the ZooKeeper session of the lost broker to expire.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from support.waiting import wait_until
from support.zookeeper import require_zookeeper

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.errors import NotEnoughReplicasError
from oncelog.harness.local_cluster import LocalCluster, cluster_down, read_cluster_file
from oncelog.harness.zookeeper import ZooKeeperServer, pid_alive
from oncelog.records.batch import HEADER_SIZE, decode_batch, parse_header

pytest.importorskip("kazoo")  # the brokers need it

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SESSION_MS = 2000
SETTINGS = {"zookeeper.session.timeout.ms": SESSION_MS, "replica.lag.time.max.ms": 2000}
DEADLINE_S = 30.0


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def make_cluster(zookeeper_server: ZooKeeperServer, tmp_path: Path
                 ) -> Iterator[Callable[..., LocalCluster]]:
    """Start a 3-broker cluster under a chroot of its own (settings: SETTINGS plus extras)."""
    started: list[LocalCluster] = []

    def make(**settings: Any) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster{len(started)}", 3,
                               zookeeper=f"{zookeeper_server.connect_string}/t-{uuid.uuid4().hex[:10]}",
                               broker_settings={**SETTINGS, **settings}, die_with_parent=True)
        started.append(cluster)
        return cluster.start()

    yield make
    for cluster in started:
        cluster.stop()


def create_topic(cluster: LocalCluster, partitions: int = 1) -> str:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(topic, partitions, replication_factor=3,
                                      config={"min.insync.replicas": "2"})])
    for p in range(partitions):
        cluster.wait_for_isr(topic, p, 3, DEADLINE_S)
    return topic


def producer(cluster: LocalCluster, **overrides: Any) -> Producer:
    config: dict[str, Any] = {
        "bootstrap_servers": cluster.bootstrap_servers, "acks": "all",
        "enable_idempotence": True, "linger_ms": 2, "request_timeout_ms": 3000,
        "delivery_timeout_ms": 60000, "retry_backoff_ms": 50, "retry_backoff_max_ms": 200}
    config.update(overrides)
    return Producer(**config)


# -- the history ----------------------------------------------------------------------------------


class History:
    """Acknowledged writes: value -> (partition, offset); and writes that failed."""

    def __init__(self) -> None:
        self.acked: dict[bytes, tuple[int, int]] = {}
        self.failed: dict[bytes, BaseException] = {}
        self._lock = threading.Lock()

    def track(self, value: bytes, future: Future) -> None:
        def done(f: Future) -> None:
            with self._lock:
                exc = f.exception()
                if exc is None:
                    md = f.result()
                    self.acked[value] = (md.partition, md.offset)
                else:
                    self.failed[value] = exc

        future.add_done_callback(done)

    def send(self, p: Producer, topic: str, prefix: str, count: int) -> None:
        """Send ``prefix-0`` .. ``prefix-<count-1>``, tracked, and wait until all are done."""
        for i in range(count):
            value = f"{prefix}-{i}".encode()
            self.track(value, p.send(topic, value))
        p.flush()

    def record(self, value: bytes, partition: int, offset: int) -> None:
        with self._lock:
            self.acked[value] = (partition, offset)

    def __len__(self) -> int:
        return len(self.acked)


class Stream:
    """A producer sending records (unique values ``tag-i``) from a thread until stopped."""

    def __init__(self, p: Producer, topic: str, history: History, tag: str,
                 partitions: int = 1, pause_s: float = 0.002) -> None:
        self.p, self.topic, self.history, self.tag = p, topic, history, tag
        self.partitions, self.pause_s = partitions, pause_s
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            value = f"{self.tag}-{self.sent}".encode()
            self.history.track(value, self.p.send(self.topic, value, key=value,
                                                  partition=self.sent % self.partitions))
            self.sent += 1
            time.sleep(self.pause_s)

    def acked(self) -> int:
        prefix = f"{self.tag}-".encode()
        return sum(1 for v in list(self.history.acked) if v.startswith(prefix))

    def wait_acked(self, more: int, timeout: float = DEADLINE_S) -> None:
        target = self.acked() + more
        wait_until(lambda: self.acked() >= target, timeout, f"{more} more acks of {self.tag}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.p.flush()


def read_all(cluster: LocalCluster, topic: str, partitions: int) -> dict[int, list[Any]]:
    """Every partition from its start to its end (high watermark), with our Consumer."""
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers,
                        auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        out: dict[int, list[Any]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + DEADLINE_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read {sum(map(len, out.values()))} of {ends}"
            for r in consumer.poll(0.2):
                out[r.partition].append(r)
        return out
    finally:
        consumer.close()


def check_history(history: History, records: dict[int, list[Any]],
                  absent: set[bytes] = frozenset()) -> None:  # type: ignore[assignment]
    """No acknowledged write lost (it is where it was acknowledged), none twice, offsets
    increasing; the ``absent`` values are nowhere."""
    seen: dict[bytes, tuple[int, int]] = {}
    for p, recs in records.items():
        offsets = [r.offset for r in recs]
        assert offsets == sorted(set(offsets)), f"partition {p}: offsets not increasing"
        for r in recs:
            assert r.value not in seen, f"{r.value!r} twice: {seen[r.value]} and {(p, r.offset)}"
            seen[r.value] = (p, r.offset)
    lost = {v: where for v, where in history.acked.items() if seen.get(v) != where}
    assert not lost, f"{len(lost)} acknowledged writes lost or moved, e.g. " \
        f"{sorted(lost.items())[:5]} (read: {[seen.get(v) for v in sorted(lost)[:5]]})"
    back = absent & set(seen)
    assert not back, f"{len(back)} writes that should be gone are there: {sorted(back)[:5]}"


# -- the replicas' logs on disk --------------------------------------------------------------------


def log_on_disk(directory: Path) -> list[tuple[Any, ...]]:
    """A partition directory's batches (header fields that replication must keep) and records,
    from its segment files (a broker stopped cleanly)."""
    out: list[tuple[Any, ...]] = []
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos + HEADER_SIZE <= len(data):
            h = parse_header(data, pos)
            if h.batch_length <= 0 or pos + h.size > len(data):
                break  # the preallocated zeros
            _h, records = decode_batch(data, pos)
            out.append((h.base_offset, h.last_offset, h.partition_leader_epoch, h.producer_id,
                        h.producer_epoch, h.base_sequence,
                        tuple((r.offset, r.key, r.value) for r in records)))
            pos += h.size
    return out


def check_replicas_equal(cluster: LocalCluster, topic: str, partitions: int) -> None:
    """Stop the cluster cleanly and compare every partition's log across its replicas."""
    cluster.stop()
    for p in range(partitions):
        logs = {n: log_on_disk(b.data_dir / f"{topic}-{p}") for n, b in cluster.brokers.items()}
        first = logs[1]
        assert first, f"{topic}-{p}: empty log"
        for n, other in logs.items():
            if other != first:
                diverge = next((i for i, (a, b) in enumerate(zip(first, other, strict=False))
                                if a != b), min(len(first), len(other)))
                raise AssertionError(
                    f"{topic}-{p}: broker {n}'s log differs from broker 1's at batch {diverge} "
                    f"({len(other)} vs {len(first)} batches): "
                    f"{other[diverge:diverge + 1]} vs {first[diverge:diverge + 1]}")


def settle(cluster: LocalCluster, topic: str, partitions: int, history: History) -> None:
    """All replicas in sync, then one more acks=all write per partition (its acknowledgement
    means every in-sync replica has everything before it)."""
    for p in range(partitions):
        cluster.wait_for_isr(topic, p, 3, DEADLINE_S)
    with contextlib.closing(producer(cluster)) as p:
        for index in range(partitions):
            value = f"settle-{index}".encode()
            md = p.send(topic, value, partition=index).result(DEADLINE_S)
            history.record(value, md.partition, md.offset)
    for index in range(partitions):
        cluster.wait_for_isr(topic, index, 3, DEADLINE_S)


# -- the tests --------------------------------------------------------------------------------------


def stream_through_fault(cluster: LocalCluster, topic: str, partitions: int, name: str,
                         fault: Callable[[int], None], heal: Callable[[int], None]) -> None:
    """acks=all sends to every partition while partition 0's leader suffers ``fault``: acked
    before it, on the new leader while it lasts, and after ``heal`` with the full ISR back; no
    send fails, every acknowledged record is read once, and the replicas end up equal."""
    victim = cluster.leader_of(topic, 0)
    history = History()
    stream = Stream(producer(cluster), topic, history, name, partitions)
    try:
        stream.wait_acked(200)
        fault(victim)
        new_leader = cluster.wait_for_leader(topic, 0, not_on=victim)
        stream.wait_acked(200)  # on the new leaders, with 2 in-sync replicas
        heal(victim)
        for p in range(partitions):
            cluster.wait_for_isr(topic, p, 3, DEADLINE_S)
        stream.wait_acked(200)
    finally:
        stream.stop()
        stream.p.close()
    assert not history.failed, f"{len(history.failed)} sends failed: " \
        f"{next(iter(history.failed.values()))!r}"
    assert new_leader != victim
    settle(cluster, topic, partitions, history)
    check_history(history, read_all(cluster, topic, partitions))
    check_replicas_equal(cluster, topic, partitions)


def test_leader_killed_during_acks_all_stream_restarts_and_catches_up(make_cluster) -> None:
    cluster = make_cluster()
    stream_through_fault(cluster, create_topic(cluster, 3), 3, "a", cluster.kill,
                         cluster.start_broker)


def test_paused_broker_past_its_session_rejoins_truncates_and_catches_up(make_cluster) -> None:
    # Produce requests pile up in the paused leader's socket; resumed, it leads no more: it
    # must notice, rejoin and follow.
    cluster = make_cluster()
    stream_through_fault(cluster, create_topic(cluster), 1, "b", cluster.pause, cluster.resume)


def test_two_brokers_down_refuses_acks_all_until_one_returns(make_cluster) -> None:
    cluster = make_cluster()
    topic = create_topic(cluster)
    leader = cluster.leader_of(topic, 0)
    history = History()
    refused = History()
    # An idempotent producer that gives a record up after 4 s.
    with contextlib.closing(producer(cluster, delivery_timeout_ms=4000,
                                     request_timeout_ms=1000)) as p:
        history.send(p, topic, "before", 100)
        assert len(history) == 100 and not history.failed
        down = [n for n in cluster.brokers if n != leader]
        for n in down:
            cluster.kill(n)
        cluster.wait_for_isr(topic, 0, 1, DEADLINE_S)
        # One try, no retries: the broker's own answer.
        with contextlib.closing(producer(cluster, enable_idempotence=False, retries=0)) as once, \
                pytest.raises(NotEnoughReplicasError):
            once.send(topic, b"refused").result(DEADLINE_S)
        # Retried until the delivery timeout: nothing acknowledged.
        refused.send(p, topic, "refused", 20)
        assert not refused.acked, f"acknowledged with one in-sync replica: {refused.acked}"
        assert len(refused.failed) == 20
        # One broker back: acks=all works again, for the same producer.
        cluster.start_broker(down[0])
        cluster.wait_for_isr(topic, 0, 2, DEADLINE_S)
        history.send(p, topic, "after", 100)
    assert len(history) == 200 and not history.failed, history.failed
    cluster.start_broker(down[1])
    settle(cluster, topic, 1, history)
    check_history(history, read_all(cluster, topic, 1),
                  absent={b"refused"} | set(refused.failed))
    check_replicas_equal(cluster, topic, 1)


def test_old_leader_truncates_records_the_new_leader_never_had(make_cluster) -> None:
    # A longer lag time: the paused followers stay in the ISR while the leader appends alone.
    # Short replica fetch waits: a fetch the leader holds when the followers are frozen is
    # answered (empty) before the writes below (else they would reach the followers after all).
    cluster = make_cluster(**{"replica.lag.time.max.ms": 10000,
                              "replica.fetch.wait.max.ms": 100})
    topic = create_topic(cluster)
    old = cluster.leader_of(topic, 0)
    followers = [n for n in cluster.brokers if n != old]
    history = History()
    with contextlib.closing(producer(cluster)) as p:
        history.send(p, topic, "replicated", 100)
    assert len(history) == 100 and not history.failed
    # Followers frozen: acks=1 writes land on the leader only; then the leader crashes.
    unreplicated: set[bytes] = set()
    # Talking to the leader only (no metadata request to a frozen broker), warmed up.
    with contextlib.closing(producer(cluster, acks=1, enable_idempotence=False,
                                     bootstrap_servers=cluster.addresses[old])) as p1:
        p1.send(topic, b"warm-up").result(DEADLINE_S)  # acks=1: may be lost, not in history
        for n in followers:
            cluster.pause(n)
        try:
            time.sleep(0.3)  # > replica.fetch.wait.max.ms, < the session timeout
            futures = [(f"unreplicated-{i}".encode(), p1.send(topic, f"unreplicated-{i}"))
                       for i in range(50)]
            p1.flush()
            end_on_old = max(f.result().offset for _v, f in futures) + 1
            unreplicated = {v for v, _f in futures}
            cluster.kill(old)
        finally:
            for n in followers:
                cluster.resume(n)
    new = cluster.wait_for_leader(topic, 0, not_on=old)
    assert new in followers
    # The new leader writes its own records over the offsets the old one used.
    with contextlib.closing(producer(cluster)) as p:
        history.send(p, topic, "new-leader", 100)
    assert len(history) == 200 and not history.failed
    assert min(history.acked[f"new-leader-{i}".encode()][1] for i in range(100)) < end_on_old
    cluster.start_broker(old)
    settle(cluster, topic, 1, history)
    check_history(history, read_all(cluster, topic, 1), absent=unreplicated)
    truncated = (cluster.brokers[old].log_path.read_text(errors="replace"))
    assert "truncating" in truncated, "the old leader did not log a truncation"
    check_replicas_equal(cluster, topic, 1)


def test_confluent_kafka_producer_and_consumer_through_a_leader_kill(make_cluster) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    # librdkafka's consumer insists on a group.id and so asks for its coordinator, which
    # creates __consumer_offsets: one partition is enough (no group is joined).
    cluster = make_cluster(**{"offsets.topic.num.partitions": 1})
    partitions = 2
    topic = create_topic(cluster, partitions)
    victim = cluster.leader_of(topic, 0)
    history = History()
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            history.record(msg.value(), msg.partition(), msg.offset())
        else:
            errors.append(err)

    # A consumer reading all along (assign only, no group), through the kill.
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.bootstrap_servers,
                                         "group.id": f"unused-{uuid.uuid4().hex[:6]}",
                                         "enable.auto.commit": False,
                                         "auto.offset.reset": "error",
                                         "topic.metadata.refresh.interval.ms": 1000})
    consumer.assign([confluent_kafka.TopicPartition(topic, q, 0) for q in range(partitions)])
    consumed: dict[int, list[Any]] = {q: [] for q in range(partitions)}
    consumer_errors: list[Any] = []
    reading = threading.Event()
    reading.set()

    def consume(until: Callable[[], bool]) -> None:
        while not until():
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                consumer_errors.append(msg.error())
                continue
            consumed[msg.partition()].append(_Rec(msg.partition(), msg.offset(), msg.value()))

    reader = threading.Thread(target=consume, args=(lambda: not reading.is_set(),),
                              daemon=True)
    reader.start()
    p = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap_servers,
                                  "acks": "all", "enable.idempotence": True, "linger.ms": 2,
                                  "message.timeout.ms": 60000, "retry.backoff.ms": 50,
                                  "retry.backoff.max.ms": 200,
                                  "topic.metadata.refresh.interval.ms": 1000})
    sent = 0

    def produce_until(acks: int) -> None:
        nonlocal sent
        deadline = time.monotonic() + DEADLINE_S
        while len(history) < acks:
            assert time.monotonic() < deadline, f"stuck at {len(history)} acks: {errors[:3]}"
            value = f"c-{sent}".encode()
            try:
                p.produce(topic, value, key=value, partition=sent % partitions,
                          on_delivery=delivered)
                sent += 1
            except BufferError:
                pass
            p.poll(0.002)

    try:
        produce_until(300)
        cluster.kill(victim)
        produce_until(len(history) + 300)
        assert p.flush(DEADLINE_S) == 0
        assert not errors, errors[:5]
        assert len(history) == sent
        cluster.start_broker(victim)
        settle(cluster, topic, partitions, history)
        # The settling writes are the last ones: read up to them.
        ends = {q: history.acked[f"settle-{q}".encode()][1] + 1 for q in range(partitions)}
        wait_until(lambda: all(consumed[q] and consumed[q][-1].offset + 1 >= ends[q]
                               for q in range(partitions)), DEADLINE_S,
                   f"the consumer to reach {ends}")
    finally:
        reading.clear()
        reader.join()
        consumer.close()
    # Transport errors while the victim is down are fine; a reset or lost position is not.
    bad = {confluent_kafka.KafkaError._AUTO_OFFSET_RESET,
           confluent_kafka.KafkaError.OFFSET_OUT_OF_RANGE}
    assert not [e for e in consumer_errors if e.fatal() or e.code() in bad], consumer_errors
    check_history(history, consumed)
    check_history(history, read_all(cluster, topic, partitions))


class _Rec:
    def __init__(self, partition: int, offset: int, value: bytes) -> None:
        self.partition, self.offset, self.value = partition, offset, value


# -- oncelog cluster up / down ----------------------------------------------------------------------


def test_cli_cluster_up_and_down_leave_nothing_behind(tmp_path: Path) -> None:
    require_zookeeper()
    data_dir = tmp_path / "cli-cluster"
    cli = [sys.executable, "-m", "oncelog.cli.main", "cluster"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parents[1] / "src"), os.environ.get("PYTHONPATH", "")])}
    try:
        up = subprocess.run([*cli, "up", "--brokers", "3", "--data-dir", str(data_dir),
                             "--set", f"zookeeper.session.timeout.ms={SESSION_MS}"],
                            check=False, capture_output=True, text=True, timeout=120, env=env)
        assert up.returncode == 0, up.stderr
        info = read_cluster_file(data_dir)
        pids = [int(b["pid"]) for b in info["brokers"].values()]
        zk_pid = int((data_dir / "zookeeper" / "zookeeper.pid").read_text())
        bootstrap = info["bootstrap_servers"]
        assert f"bootstrap servers: {bootstrap}" in up.stdout
        for b in info["brokers"].values():
            assert b["address"] in up.stdout
        # The command has exited; the cluster runs on.
        assert all(pid_alive(pid) for pid in [*pids, zk_pid])
        twice = subprocess.run([*cli, "up", "--data-dir", str(data_dir)], check=False,
                               capture_output=True, text=True, timeout=60, env=env)
        assert twice.returncode == 1 and "still runs" in twice.stderr, twice.stderr
        assert read_cluster_file(data_dir) == info
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_topics([NewTopic("cli", 1, replication_factor=3,
                                          config={"min.insync.replicas": "2"})])
        with contextlib.closing(Producer(bootstrap_servers=bootstrap, acks="all")) as p:
            md = p.send("cli", b"hello").result(DEADLINE_S)
        assert md.offset == 0
        down = subprocess.run([*cli, "down", "--data-dir", str(data_dir)],
                              check=False, capture_output=True, text=True, timeout=60, env=env)
        assert down.returncode == 0, down.stderr
        assert "stopped brokers: 1, 2, 3; stopped ZooKeeper" in down.stdout
        left = [pid for pid in [*pids, zk_pid] if pid_alive(pid)]
        assert not left, f"processes left behind: {left}"
        for n in (1, 2, 3):
            assert "stopped cleanly" in (data_dir / f"broker-{n}" / "broker.log").read_text()
        again = subprocess.run([*cli, "down", "--data-dir", str(data_dir)],
                               check=False, capture_output=True, text=True, timeout=60, env=env)
        assert again.returncode == 0 and "none running" in again.stdout
    finally:
        with contextlib.suppress(FileNotFoundError):
            cluster_down(data_dir, timeout=5)
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.killpg(int((data_dir / "zookeeper" / "zookeeper.pid").read_text()),
                      signal.SIGKILL)
    assert json.loads((data_dir / "cluster.json").read_text())["brokers"]["1"]["pid"] is None

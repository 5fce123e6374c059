"""Cluster mode: the cost of replication, and how long a partition is unavailable when its
leader crashes, on one local 3-broker cluster (oncelog.harness.local_cluster) in one run.

    .venv/bin/python benchmarks/bench_cluster.py [--records 20000] [--confluent-records 100000]
                                                 [--size 1024] [--rounds 3]
                                                 [--trials 5] [--session-timeout-ms 3000]
                                                 [--client both|oncelog|confluent]
                                                 [--baseline CHECKOUT] [--profile DIR]

Throughput: a producer sends the same payloads (``--records`` values of ``--size`` bytes,
round-robin over 3 partitions) to a topic of replication factor 3 with acks=all (idempotent,
min.insync.replicas 2) and to a topic of replication factor 1 with acks=1 (not idempotent:
idempotence needs acks=all), alternating, ``--rounds`` times; the time is from the first send
to the last acknowledgement. The producer is our Producer, confluent-kafka's (librdkafka), or
each in turn (``--client both``, the default; linger.ms 5 for both). Figures are records/s and
payload MB/s (10^6 bytes of values), and the CPU milliseconds per payload MB of the three
brokers together and of each (user + system, from /proc: what replication costs whatever the
machine's load) and of the producer's process; "busy" is the brokers' and the producer's CPU
over the wall time of the machine's cores, "machine" the share of the cores not idle (every
process, ZooKeeper's and other work on the machine included): near 1.0 the round was
CPU-bound, well below it the round waited on something else (round trips, the disk). The
Produce and Fetch requests (the followers' and any consumer's) the brokers answered per MB
come from their metrics pages (metrics.port 0). The summary gives, per producer,
the medians and the ratio RF 3 / RF 1.

Page cache: each round writes to a topic of its own, deleted after it. On this virtual machine,
page cache beyond what was recently freed cost ten times the system CPU per byte written (dd:
three 1 GB files one after another, 0.22, 0.31 and 2.35 s of system time; 0.22 s each when the
previous one was deleted first: the host's first touch of guest memory, or reclaim), and an
RF 3 round writes three copies: keeping every round's data would measure the machine's memory,
not the brokers.

``--baseline CHECKOUT`` (say ``git worktree add /tmp/base main``, its C extensions built) runs
a second cluster of that checkout's brokers beside this one's (same ZooKeeper), and every
measurement is made on each in turn: before/after figures from one run on a noisy machine.

``--profile DIR`` records each broker with py-spy (on PATH or beside this Python) during the
first RF 3 round of each producer: DIR/this/<client>-broker-N.txt, collapsed stacks
(``py-spy record --format raw``, 200 Hz; ``PY_SPY_OPTIONS``, default ``--nonblocking``, adds
options such as ``--gil`` or ``--native``).

Failover: a warmed-up idempotent acks=all producer; the partition's leader is SIGKILLed and one
record is sent at once; the time is until its acknowledgement, which comes from the new leader
(the producer retries meanwhile). The controller only elects a new leader once ZooKeeper expires
the dead broker's session, so this is dominated by zookeeper.session.timeout.ms. The broker is
restarted and back in the ISR before the next trial.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Self

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from oncelog import Admin, NewTopic, Producer
from oncelog.harness.local_cluster import LocalCluster

PARTITIONS = 3
# py-spy record's options beyond pid, format and output: --native (C frames) pauses the process
# for each sample, which --nonblocking does not.
PY_SPY_OPTIONS = os.environ.get("PY_SPY_OPTIONS", "--nonblocking").split()


def create(cluster: LocalCluster, rf: int, min_isr: int) -> str:
    name = f"bench-rf{rf}-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(name, PARTITIONS, replication_factor=rf,
                                      config={"min.insync.replicas": str(min_isr)})])
    for p in range(PARTITIONS):
        cluster.wait_for_isr(name, p, rf, 30)
    return name


def drop(cluster: LocalCluster, topic: str, timeout: float = 30.0) -> None:
    """Delete ``topic`` and wait until no broker keeps its files: their page cache is freed
    for the next round (see "Page cache" above)."""
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.delete_topics([topic])
    deadline = time.monotonic() + timeout
    while any(any(b.data_dir.glob(f"{topic}-*")) for b in cluster.brokers.values()):
        if time.monotonic() > deadline:
            print(f"(the files of {topic} are still there after {timeout:g} s)", file=sys.stderr)
            return
        time.sleep(0.1)


def producer_config(cluster: LocalCluster, rf: int) -> dict:
    if rf == 1:
        return {"bootstrap_servers": cluster.bootstrap_servers, "acks": 1,
                "enable_idempotence": False}
    return {"bootstrap_servers": cluster.bootstrap_servers, "acks": "all",
            "enable_idempotence": True}


def cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_times() -> tuple[int, int]:
    """(idle, total) clock ticks of all the machine's cores so far (/proc/stat)."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return ticks[3] + ticks[4], sum(ticks)  # idle + iowait


def metrics_url(cluster: LocalCluster, n: int) -> str | None:
    """Broker ``n``'s metrics page (metrics.port=0: it says which port it took)."""
    found = re.findall(r"oncelog metrics at (http://\S+/metrics)",
                       cluster.brokers[n].log_path.read_text(errors="replace"))
    return found[-1] if found else None


def request_counts(urls: dict[int, str | None]) -> Counter[str]:
    """Requests the brokers have answered so far, by API, summed over the brokers."""
    counts: Counter[str] = Counter()
    for url in urls.values():
        if url is None:
            continue
        with urllib.request.urlopen(url, timeout=10) as page:
            for line in page.read().decode().splitlines():
                m = re.match(r'oncelog_requests_total\{request="(\w+)",version="\d+"\} (\d+)',
                             line)
                if m:
                    counts[m[1]] += int(m[2])
    return counts


class Meter:
    """CPU seconds of the brokers, of this process and of the whole machine (every process,
    other work on it included), and the brokers' Produce and Fetch requests, over one timed
    phase."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.pids = {n: b.pid for n, b in cluster.brokers.items() if b.pid is not None}
        self.urls = {n: metrics_url(cluster, n) for n in self.pids}

    def __enter__(self) -> Self:
        self.requests_start = request_counts(self.urls)
        self.start = {n: cpu_seconds(pid) for n, pid in self.pids.items()}
        self.client_start = cpu_seconds("self")
        self.machine_start = machine_times()
        return self

    def __exit__(self, *exc: object) -> None:
        self.brokers = {n: cpu_seconds(pid) - self.start[n] for n, pid in self.pids.items()}
        self.requests = request_counts(self.urls) - self.requests_start
        self.client = cpu_seconds("self") - self.client_start
        idle, total = machine_times()
        busy = (total - self.machine_start[1]) - (idle - self.machine_start[0])
        self.machine_busy = busy / max(total - self.machine_start[1], 1)


def produce_oncelog(cluster: LocalCluster, topic: str, rf: int, records: int, value: bytes,
                    meter: Meter) -> float:
    """Seconds for our Producer to send and have acknowledged ``records`` values (after a
    warm-up)."""
    with contextlib.closing(Producer(**producer_config(cluster, rf))) as p:
        for q in range(PARTITIONS):  # metadata, producer id, connections: not timed
            p.send(topic, b"warm-up", partition=q)
        p.flush()
        with meter:
            start = time.perf_counter()
            futures = [p.send(topic, value, partition=i % PARTITIONS) for i in range(records)]
            p.flush()
            elapsed = time.perf_counter() - start
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert not failed, failed[:3]
    return elapsed


def produce_confluent(cluster: LocalCluster, topic: str, rf: int, records: int, value: bytes,
                      meter: Meter) -> float:
    """The same with confluent-kafka's Producer (librdkafka), configured alike."""
    import confluent_kafka

    config = {"bootstrap.servers": cluster.bootstrap_servers, "linger.ms": 5,
              "acks": "1" if rf == 1 else "all", "enable.idempotence": rf != 1}
    p = confluent_kafka.Producer(config)
    failed: list = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(err)

    for q in range(PARTITIONS):
        p.produce(topic, b"warm-up", partition=q, on_delivery=delivered)
    p.flush(30)
    with meter:
        start = time.perf_counter()
        for i in range(records):
            while True:
                try:
                    p.produce(topic, value, partition=i % PARTITIONS, on_delivery=delivered)
                    break
                except BufferError:  # queue.buffering.max.*: wait for deliveries
                    p.poll(0.01)
            p.poll(0)
        left = p.flush(120)
        elapsed = time.perf_counter() - start
    assert not left and not failed, (left, failed[:3])
    return elapsed


PRODUCERS = {"oncelog": produce_oncelog, "confluent": produce_confluent}


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def profiled(cluster: LocalCluster, out_dir: Path | None, name: str):
    """py-spy records every broker while the block runs (nothing without ``out_dir``)."""
    exe = py_spy() if out_dir is not None else None
    if out_dir is not None and exe is None:
        print("--profile: no py-spy found", file=sys.stderr)
    if exe is None or out_dir is None:
        yield
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen([exe, "record", "--pid", str(b.pid), "--format", "raw",
                               "--rate", "200", *PY_SPY_OPTIONS,
                               "--output", str(out_dir / f"{name}-broker-{n}.txt")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for n, b in cluster.brokers.items() if b.pid is not None]
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for proc in procs:
            proc.wait(30)


def failover_trial(cluster: LocalCluster, topic: str) -> tuple[float, int, int]:
    """(seconds from SIGKILL of the leader of partition 0 to the first acknowledged write,
    old leader, new leader)."""
    with contextlib.closing(Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all",
                                     enable_idempotence=True, linger_ms=0,
                                     request_timeout_ms=2000, retry_backoff_ms=20,
                                     retry_backoff_max_ms=100,
                                     delivery_timeout_ms=120000)) as p:
        p.send(topic, b"warm-up", partition=0).result(30)
        old = cluster.leader_of(topic, 0)
        start = time.perf_counter()
        cluster.kill(old)
        p.send(topic, b"after the kill", partition=0).result(120)
        elapsed = time.perf_counter() - start
    new = cluster.leader_of(topic, 0)
    assert new not in (old, -1), (old, new)
    cluster.start_broker(old)
    cluster.wait_for_isr(topic, 0, 3, 60)
    return elapsed, old, new


def start_clusters(stack: contextlib.ExitStack, tmp: Path, settings: dict[str, str],
                   baseline: Path | None) -> dict[str, LocalCluster]:
    """This checkout's cluster and, with ``baseline``, one of that checkout's brokers beside it
    (same ZooKeeper, another chroot), idle while the other is measured."""
    clusters = {"this": stack.enter_context(
        LocalCluster(tmp / "this", 3, broker_settings=settings, die_with_parent=True))}
    if baseline is not None:
        zk = clusters["this"].zookeeper
        assert zk is not None
        clusters["baseline"] = stack.enter_context(LocalCluster(
            tmp / "baseline", 3, zookeeper=zk.connect_string, chroot="/oncelog-baseline",
            broker_settings=settings, die_with_parent=True,
            env={"PYTHONPATH": str(baseline.resolve() / "src")}))
    return clusters


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000, help="per round, our Producer")
    ap.add_argument("--confluent-records", type=int, default=100_000,
                    help="per round, confluent-kafka's (faster: long enough a round to time)")
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5, help="leader kills")
    ap.add_argument("--client", choices=("both", *PRODUCERS), default="both",
                    help="the producer of the throughput rounds (default: each in turn)")
    ap.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                    help="also run another checkout's brokers (a second cluster), alternating")
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="py-spy each broker during the first RF 3 round of each producer")
    ap.add_argument("--session-timeout-ms", type=int, default=3000,
                    help="zookeeper.session.timeout.ms of the brokers (default 3000)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another broker setting (repeatable)")
    args = ap.parse_args(argv)
    if args.baseline is not None and not (args.baseline / "src" / "oncelog").is_dir():
        ap.error(f"{args.baseline} is not an oncelog checkout (no src/oncelog)")
    value = os.urandom(args.size)
    clients = list(PRODUCERS) if args.client == "both" else [args.client]
    records = {"oncelog": args.records, "confluent": args.confluent_records}
    cores = os.cpu_count() or 1
    settings = {"zookeeper.session.timeout.ms": str(args.session_timeout_ms),
                "replica.lag.time.max.ms": "10000", "metrics.port": "0",
                **dict(s.split("=", 1) for s in args.set)}
    print(f"3 brokers, settings {settings}; {cores} CPUs")
    sizes = ", ".join(f"{c} {records[c]} records x {args.size} B = "
                      f"{records[c] * args.size / 1e6:.1f} MB" for c in clients)
    print(f"throughput: {sizes} per round over {PARTITIONS} partitions, {args.rounds} rounds, "
          "linger.ms 5")
    if args.baseline is not None:
        print(f"checkouts: this, and baseline {args.baseline} (a cluster of its own), "
              "alternating")
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-cluster-") as tmp, \
            contextlib.ExitStack() as stack:
        clusters = start_clusters(stack, Path(tmp), settings, args.baseline)
        rates: dict[tuple[str, str, int], list[float]] = {}
        cpu: dict[tuple[str, str, int], list[float]] = {}
        for r in range(args.rounds):
            for client in clients:
                n = records[client]
                mb = n * args.size / 1e6
                for rf in (3, 1):
                    for name, cluster in clusters.items():
                        topic = create(cluster, rf, 2 if rf == 3 else 1)
                        meter = Meter(cluster)
                        profile = args.profile / name if args.profile and r == 0 and rf == 3 \
                            else None
                        with profiled(cluster, profile, client):
                            seconds = PRODUCERS[client](cluster, topic, rf, n, value, meter)
                        drop(cluster, topic)
                        key = (name, client, rf)
                        rates.setdefault(key, []).append(n / seconds)
                        brokers = sum(meter.brokers.values())
                        cpu.setdefault(key, []).append(brokers / mb)
                        label = "RF 3 acks=all" if rf == 3 else "RF 1 acks=1  "
                        per = " ".join(f"{1000 * meter.brokers[b] / mb:.1f}"
                                       for b in sorted(meter.brokers))
                        who = f"{name:8} " if len(clusters) > 1 else ""
                        print(f"round {r + 1} {who}{client:9} {label} {n / seconds:8.0f} "
                              f"records/s {mb / seconds:7.2f} MB/s; CPU ms/MB brokers "
                              f"{1000 * brokers / mb:5.1f} ({per}) producer "
                              f"{1000 * meter.client / mb:4.1f}; busy "
                              f"{(brokers + meter.client) / (seconds * cores):.2f}, machine "
                              f"{meter.machine_busy:.2f}; requests/MB Produce "
                              f"{meter.requests['Produce'] / mb:.0f} Fetch "
                              f"{meter.requests['Fetch'] / mb:.0f}", flush=True)
        for name in clusters:
            who = f"{name:8} " if len(clusters) > 1 else ""
            for client in clients:
                m3 = statistics.median(rates[(name, client, 3)])
                m1 = statistics.median(rates[(name, client, 1)])
                for rf, m in ((3, m3), (1, m1)):
                    label = "RF 3 acks=all" if rf == 3 else "RF 1 acks=1  "
                    print(f"median {who}{client:9} {label} {m:8.0f} records/s "
                          f"{m * args.size / 1e6:7.2f} MB/s; brokers "
                          f"{1000 * statistics.median(cpu[(name, client, rf)]):.1f} CPU ms/MB")
                print(f"ratio {who}{client} RF 3 acks=all / RF 1 acks=1: {m3 / m1:.2f}")
        print()
        if args.trials <= 0:
            return 0
        print(f"failover: SIGKILL of the leader of a partition (RF 3, min.insync.replicas 2) "
              f"-> first acknowledged acks=all write on the new leader; "
              f"zookeeper.session.timeout.ms={args.session_timeout_ms}")
        failover = {name: create(c, 3, 2) for name, c in clusters.items()}
        times: dict[str, list[float]] = {name: [] for name in clusters}
        for t in range(args.trials):
            for name, cluster in clusters.items():
                seconds, old, new = failover_trial(cluster, failover[name])
                times[name].append(seconds)
                who = f" {name}" if len(clusters) > 1 else ""
                print(f"trial {t + 1}{who}: {seconds:6.2f} s (leader {old} -> {new})",
                      flush=True)
        for name, ts in times.items():
            who = f" {name}" if len(clusters) > 1 else ""
            print(f"failover median{who} {statistics.median(ts):.2f} s, min {min(ts):.2f} s, "
                  f"max {max(ts):.2f} s (session timeout {args.session_timeout_ms / 1000:g} s: "
                  "the controller elects once ZooKeeper expires the dead broker's session)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

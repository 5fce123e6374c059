"""Cluster mode: the cost of replication, and how long a partition is unavailable when its
leader crashes, on one local 3-broker cluster (oncelog.harness.local_cluster) in one run.

    .venv/bin/python benchmarks/bench_cluster.py [--records 20000] [--size 1024] [--rounds 3]
                                                 [--trials 5] [--session-timeout-ms 3000]

Throughput: our Producer sends the same payloads (``--records`` values of ``--size`` bytes,
round-robin over 3 partitions) to a topic of replication factor 3 with acks=all (idempotent,
min.insync.replicas 2) and to a topic of replication factor 1 with acks=1 (not idempotent:
idempotence needs acks=all), alternating, ``--rounds`` times; the time is from the first send
to the last acknowledgement. Figures are records/s and payload MB/s (10^6 bytes of values); the
summary gives the medians and the ratio RF 3 / RF 1.

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
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from oncelog import Admin, NewTopic, Producer
from oncelog.harness.local_cluster import LocalCluster

PARTITIONS = 3


def create(cluster: LocalCluster, rf: int, min_isr: int) -> str:
    name = f"bench-rf{rf}-{uuid.uuid4().hex[:6]}"
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topics([NewTopic(name, PARTITIONS, replication_factor=rf,
                                      config={"min.insync.replicas": str(min_isr)})])
    for p in range(PARTITIONS):
        cluster.wait_for_isr(name, p, rf, 30)
    return name


def producer_config(cluster: LocalCluster, rf: int) -> dict:
    if rf == 1:
        return {"bootstrap_servers": cluster.bootstrap_servers, "acks": 1,
                "enable_idempotence": False}
    return {"bootstrap_servers": cluster.bootstrap_servers, "acks": "all",
            "enable_idempotence": True}


def produce(cluster: LocalCluster, topic: str, rf: int, records: int, value: bytes) -> float:
    """Seconds to send and have acknowledged ``records`` values (after a warm-up)."""
    with contextlib.closing(Producer(**producer_config(cluster, rf))) as p:
        for q in range(PARTITIONS):  # metadata, producer id, connections: not timed
            p.send(topic, b"warm-up", partition=q)
        p.flush()
        start = time.perf_counter()
        futures = [p.send(topic, value, partition=i % PARTITIONS) for i in range(records)]
        p.flush()
        elapsed = time.perf_counter() - start
    failed = [f.exception() for f in futures if f.exception() is not None]
    assert not failed, failed[:3]
    return elapsed


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--size", type=int, default=1024, help="value size in bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=5, help="leader kills")
    ap.add_argument("--session-timeout-ms", type=int, default=3000,
                    help="zookeeper.session.timeout.ms of the brokers (default 3000)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another broker setting (repeatable)")
    args = ap.parse_args(argv)
    value = os.urandom(args.size)
    mb = args.records * args.size / 1e6
    settings = {"zookeeper.session.timeout.ms": str(args.session_timeout_ms),
                "replica.lag.time.max.ms": "10000",
                **dict(s.split("=", 1) for s in args.set)}
    print(f"3 brokers, settings {settings}; {os.cpu_count()} CPUs")
    print(f"throughput: {args.records} records x {args.size} B = {mb:.1f} MB per round over "
          f"{PARTITIONS} partitions, {args.rounds} rounds; our Producer, linger.ms 5 (default)")
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-cluster-") as tmp, \
            LocalCluster(Path(tmp) / "cluster", 3, broker_settings=settings,
                         die_with_parent=True) as cluster:
        rf3 = create(cluster, 3, 2)
        rf1 = create(cluster, 1, 1)
        rates: dict[str, list[float]] = {"rf3": [], "rf1": []}
        for r in range(args.rounds):
            for name, topic, rf in (("rf3", rf3, 3), ("rf1", rf1, 1)):
                seconds = produce(cluster, topic, rf, args.records, value)
                rates[name].append(args.records / seconds)
                label = "RF 3 acks=all" if rf == 3 else "RF 1 acks=1  "
                print(f"round {r + 1} {label} {args.records / seconds:8.0f} records/s "
                      f"{mb / seconds:7.2f} MB/s", flush=True)
        m3, m1 = statistics.median(rates["rf3"]), statistics.median(rates["rf1"])
        print(f"median    RF 3 acks=all {m3:8.0f} records/s {m3 * args.size / 1e6:7.2f} MB/s")
        print(f"median    RF 1 acks=1   {m1:8.0f} records/s {m1 * args.size / 1e6:7.2f} MB/s")
        print(f"ratio RF 3 acks=all / RF 1 acks=1: {m3 / m1:.2f}")
        print()
        print(f"failover: SIGKILL of the leader of a partition (RF 3, min.insync.replicas 2) "
              f"-> first acknowledged acks=all write on the new leader; "
              f"zookeeper.session.timeout.ms={args.session_timeout_ms}")
        topic = create(cluster, 3, 2)
        times = []
        for t in range(args.trials):
            seconds, old, new = failover_trial(cluster, topic)
            times.append(seconds)
            print(f"trial {t + 1}: {seconds:6.2f} s (leader {old} -> {new})", flush=True)
        print(f"failover median {statistics.median(times):.2f} s, min {min(times):.2f} s, "
              f"max {max(times):.2f} s (session timeout {args.session_timeout_ms / 1000:g} s: "
              "the controller elects once ZooKeeper expires the dead broker's session)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

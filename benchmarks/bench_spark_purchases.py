"""What exactly-once costs in Spark: spec 001's job as a Structured Streaming query
(oncelog.spark.purchases_job: purchases -> invoices + shipments) written by the exactly-once
``oncelog`` sink (a two-phase commit per task, the driver completes them all), over the same
query written at least once through our client (foreachBatch, a plain producer per executor
task). One process, one SparkSession (local[2]), a fresh embedded broker (2PC enabled) per run,
the two sinks alternating their order every round.

    .venv/bin/python benchmarks/bench_spark_purchases.py [--purchases 20000] [--rounds 3]
        [--max-offsets-per-trigger 2000] [--trigger-ms 0] [--warm-up 2000]

A warm-up run of each sink comes first (the first micro-batch of a session pays ~15-20 s of
Python worker start-up); it is reported, not counted. In each measured run the first micro-batch
(query start: planning, first connections) is also left out: throughput is the purchases of
the later micro-batches over the time from the end of the first one to the end of the last one,
and latency is each later micro-batch's ``durationMs.triggerExecution`` (median, p95 over all
rounds). The summary gives the median throughput of the rounds and the ratio
exactly-once/at-least-once (target >= 0.8), and checks that every exactly-once run's
read_committed output holds every purchase exactly once (invoices and shipments).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.examples.purchases import purchase
from oncelog.server.embedded import EmbeddedBroker
from oncelog.spark import purchases_job as job

PARTITIONS = 3
SINKS = ("exactly-once", "at-least-once")


def preload(bootstrap: str, n: int) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(t, PARTITIONS)
                             for t in (job.PURCHASES, job.INVOICES, job.SHIPMENTS)])
    with Producer(bootstrap_servers=bootstrap, linger_ms=5) as p:
        for i in range(n):
            p.send(job.PURCHASES, purchase(i), key=str(i).encode(), partition=i % PARTITIONS)
        p.flush()


def output_counts(bootstrap: str, topic: str, n: int) -> Counter:
    """How many times each purchase id appears in ``topic``, read_committed up to its LSO."""
    c = Consumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                 auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        ids: Counter = Counter()
        deadline = time.monotonic() + 60
        while not all(c.position(tp) >= e for tp, e in ends.items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"could not read {topic} to its end")
            for r in c.poll(0.3):
                ids[json.loads(r.value)["purchase"]] += 1
        return ids
    finally:
        c.close()


def _end_s(p: dict) -> float:
    """A progress report's trigger end, in seconds (its timestamp is the trigger's start)."""
    start = datetime.fromisoformat(p["timestamp"]).timestamp()
    return start + p["durationMs"]["triggerExecution"] / 1000


def run(spark, sink: str, n: int, args) -> dict:
    """One run of the query on a fresh broker holding ``n`` purchases, until it has read them
    all. Returns its figures."""
    with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true"}) as broker, \
            tempfile.TemporaryDirectory(prefix="bench-spark-ck-", dir=args.work_dir) as ck:
        bootstrap = broker.bootstrap_servers
        preload(bootstrap, n)
        batches: list[dict] = []
        seen = 0
        started = time.perf_counter()
        query = job.start(spark, bootstrap, str(Path(ck) / "checkpoint"), sink,
                          args.max_offsets_per_trigger, args.trigger_ms)

        def on_batch(p: dict) -> None:
            nonlocal seen
            batches.append(p)
            seen += p["numInputRows"]
            if seen >= n:
                query.stop()

        # until_idle: a safety net only, the query is stopped once it has read every purchase
        total = job.follow(query, until_idle=args.idle_timeout, on_batch=on_batch)
        wall = time.perf_counter() - started
        if total != n:
            raise RuntimeError(f"{sink}: the query read {total} purchases of {n}")
        batches.sort(key=lambda p: p["batchId"])
        first, rest = batches[0], batches[1:]
        steady_s = _end_s(batches[-1]) - _end_s(first) if rest else float("nan")
        invoices = output_counts(bootstrap, job.INVOICES, n)
        shipments = output_counts(bootstrap, job.SHIPMENTS, n)
    once = all(ids.keys() == set(range(n)) and set(ids.values()) == {1}
               for ids in (invoices, shipments))
    return {
        "sink": sink, "wall_s": wall, "batches": len(batches),
        "first_ms": first["durationMs"]["triggerExecution"],
        "rate": sum(p["numInputRows"] for p in rest) / steady_s if rest else float("nan"),
        "latencies": [p["durationMs"]["triggerExecution"] for p in rest],
        "invoices": sum(invoices.values()), "shipments": sum(shipments.values()),
        "exactly_once": once,
    }


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--purchases", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=2000)
    ap.add_argument("--trigger-ms", type=int, default=0,
                    help="processing-time trigger interval (0: micro-batches back to back)")
    ap.add_argument("--warm-up", type=int, default=2000,
                    help="purchases of the (uncounted) warm-up run of each sink; 0: none")
    ap.add_argument("--idle-timeout", type=float, default=120.0,
                    help="give up on a run after this many seconds without a micro-batch")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--work-dir", default=None,
                    help="where checkpoints go (default: the system's temporary directory)")
    args = ap.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS",  # no progress bars among the figures
                          "--conf spark.ui.showConsoleProgress=false pyspark-shell")
    t0 = time.perf_counter()
    spark = job.spark_session(args.master, app="oncelog-bench-spark-purchases")
    print(f"{args.purchases} purchases x {args.rounds} rounds per sink, {PARTITIONS} partitions, "
          f"maxOffsetsPerTrigger {args.max_offsets_per_trigger}, trigger "
          f"{args.trigger_ms} ms, {args.master}; Spark started in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    results: dict[str, list[dict]] = {s: [] for s in SINKS}
    failed = False
    try:
        if args.warm_up:
            for sink in SINKS:
                r = run(spark, sink, args.warm_up, args)
                print(f"warm-up   {sink:13s} {args.warm_up} purchases in {r['wall_s']:5.1f} s "
                      f"(first micro-batch {r['first_ms'] / 1000:5.1f} s)", flush=True)
        for rnd in range(args.rounds):
            for sink in SINKS if rnd % 2 == 0 else SINKS[::-1]:  # alternate: cancel drift
                r = run(spark, sink, args.purchases, args)
                results[sink].append(r)
                lat = r["latencies"]
                check = "exactly once" if r["exactly_once"] else (
                    f"NOT exactly once: {r['invoices']} invoices, {r['shipments']} shipments")
                print(f"round {rnd + 1} {sink:13s} {r['rate']:7.0f} purchases/s   "
                      f"{r['batches']:3d} batches, first {r['first_ms']:5d} ms, then median "
                      f"{statistics.median(lat):5.0f} ms   run {r['wall_s']:5.1f} s   {check}",
                      flush=True)
                if sink == "exactly-once" and not r["exactly_once"]:
                    failed = True
    finally:
        spark.stop()
    print()
    print(f"{'sink':13s} {'purchases/s':>11s} {'batch median':>12s} {'batch p95':>9s} "
          f"{'first batch':>11s}  read_committed output")
    rates = {}
    for sink in SINKS:
        rs = results[sink]
        lat = [x for r in rs for x in r["latencies"]]
        rates[sink] = statistics.median(r["rate"] for r in rs)
        out = "every purchase exactly once" if all(r["exactly_once"] for r in rs) else \
            ", ".join(f"{r['invoices']}+{r['shipments']}" for r in rs) + " invoices+shipments"
        print(f"{sink:13s} {rates[sink]:11.0f} {statistics.median(lat):9.0f} ms "
              f"{pct(lat, 0.95):6.0f} ms {statistics.median(r['first_ms'] for r in rs):8.0f} ms"
              f"  {out}")
    ratio = rates["exactly-once"] / rates["at-least-once"]
    print(f"exactly-once/at-least-once {ratio:5.3f} (target >= 0.8)   "
          f"total run time {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The purchases application as a Spark Structured Streaming job: every purchase read from
``purchases`` (read_committed) becomes one invoice in ``invoices`` and one shipment in
``shipments``, written by the exactly-once ``oncelog`` sink (each micro-batch is one atomic
two-phase commit across its tasks)::

    python -m oncelog.spark.purchases_job --bootstrap-server HOST:PORT --checkpoint DIR

The driver prints one line per micro-batch (``batch N: R purchases in M ms``) and runs until it
is killed, or with ``--until-idle S`` until no purchase has arrived for S seconds. Run it again
with the same ``--checkpoint`` after a crash: it continues exactly where the sink's last
committed micro-batch ended.

``--sink at-least-once`` writes the same rows with plain (idempotent, non-transactional)
producers of our client from the executors, as Spark's own Kafka sink does: a replayed batch
is written twice. It is there to compare against (benchmarks/bench_spark_purchases.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

PURCHASES, INVOICES, SHIPMENTS = "purchases", "invoices", "shipments"
PURCHASE_SCHEMA = "id long, user string, quantity int, price int"
ADDRESS = "SomeStreet 12/18, Warsaw"


def spark_session(master: str = "local[2]", app: str = "oncelog-purchases"):
    """A local SparkSession with the oncelog data source registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from . import register

    spark = (SparkSession.builder.master(master).appName(app)
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def invoices_and_shipments(spark, bootstrap: str, max_offsets_per_trigger: int | None,
                           extra: dict[str, str] | None = None):
    """The job's transformation: a streaming DataFrame of (key, topic, value) rows, two per
    purchase (an invoice and a shipment, as oncelog.examples.purchases makes them)."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", PURCHASES).option("startingOffsets", "earliest"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for k, v in (extra or {}).items():
        reader = reader.option(k, v)
    p = reader.load().select(
        "key", F.from_json(F.col("value").cast("string"), PURCHASE_SCHEMA).alias("p"))
    invoice = F.to_json(F.struct(F.col("p.id").alias("purchase"), F.col("p.user").alias("user"),
                                 (F.col("p.quantity") * F.col("p.price")).alias("total")))
    shipment = F.to_json(F.struct(F.col("p.id").alias("purchase"), F.col("p.user").alias("user"),
                                  F.lit(ADDRESS).alias("address")))
    out = F.explode(F.array(
        F.struct(F.lit(INVOICES).alias("topic"), invoice.alias("value")),
        F.struct(F.lit(SHIPMENTS).alias("topic"), shipment.alias("value"))))
    return (p.select("key", out.alias("o"))
            .select("key", F.col("o.topic").alias("topic"),
                    F.col("o.value").cast("binary").alias("value")))


def _at_least_once_batch(bootstrap: str):
    """foreachBatch function: each executor task sends its rows with a plain producer."""

    def write_partition(rows) -> None:
        from .. import Producer

        with Producer({"bootstrap.servers": bootstrap, "linger.ms": "5"}) as p:
            for r in rows:
                p.send(r.topic, r.value, key=r.key)
            p.flush()

    def write_batch(df, batch_id: int) -> None:
        df.foreachPartition(write_partition)

    return write_batch


def start(spark, bootstrap: str, checkpoint: str, sink: str = "exactly-once",
          max_offsets_per_trigger: int | None = 500, trigger_ms: int = 500,
          extra: dict[str, str] | None = None):
    """Start the job's streaming query; returns it."""
    rows = invoices_and_shipments(spark, bootstrap, max_offsets_per_trigger, extra)
    writer = rows.writeStream.option("checkpointLocation", checkpoint).trigger(
        processingTime=f"{trigger_ms} milliseconds")
    if sink == "exactly-once":
        writer = writer.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
    elif sink == "at-least-once":
        writer = writer.foreachBatch(_at_least_once_batch(bootstrap))
    else:
        raise ValueError(f"sink must be exactly-once or at-least-once, not {sink!r}")
    return writer.start()


def follow(query, until_idle: float | None, on_batch=None) -> int:
    """Wait for the query, reporting each finished micro-batch's progress to ``on_batch``;
    stop it after ``until_idle`` seconds without input (never, with None). Returns the number
    of input rows."""
    seen: set[int] = set()
    total = 0
    idle_since = time.monotonic()
    while query.isActive:
        for p in query.recentProgress:
            if p["batchId"] in seen:
                continue
            seen.add(p["batchId"])
            total += p["numInputRows"]
            if p["numInputRows"]:
                idle_since = time.monotonic()
                if on_batch is not None:
                    on_batch(p)
        if until_idle is not None and time.monotonic() - idle_since > until_idle \
                and not query.status["isTriggerActive"]:
            query.stop()
            break
        time.sleep(0.1)
    exc: Any = query.exception()
    if exc is not None:
        raise RuntimeError(f"the streaming query failed: {exc}")
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oncelog.spark.purchases_job",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--sink", choices=["exactly-once", "at-least-once"], default="exactly-once")
    ap.add_argument("--until-idle", type=float, default=None,
                    help="stop after this many seconds without a purchase (default: run on)")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=500)
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args(argv)
    spark = spark_session(args.master)
    try:
        print("started", flush=True)
        q = start(spark, args.bootstrap_server, args.checkpoint, args.sink,
                  args.max_offsets_per_trigger, args.trigger_ms)

        def report(p: dict) -> None:
            if os.environ.get("ONCELOG_DEBUG_PROGRESS"):
                print(p["durationMs"], file=sys.stderr, flush=True)
            print(f"batch {p['batchId']}: {p['numInputRows']} purchases in "
                  f"{p['durationMs'].get('triggerExecution', 0)} ms", flush=True)

        try:
            follow(q, args.until_idle, report)
        except RuntimeError as exc:
            print(exc, file=sys.stderr, flush=True)
            return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

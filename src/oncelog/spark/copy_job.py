"""A Structured Streaming job that copies one oncelog topic to another exactly once (the sink's
test and demo driver): ``python -m oncelog.spark.copy_job --bootstrap-server HOST:PORT
--source in --sink out --checkpoint DIR [--until N] [--max-offsets-per-trigger M]``.

Runs until the sink has committed ``--until`` source offsets (as Spark's progress reports), or
forever. Tests crash or stall it at the sink's fault points (oncelog/spark/fault_points.py)."""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m oncelog.spark.copy_job")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--sink", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--until", type=int, default=None, help="stop after this many input rows "
                    "(0: once the source is read to its end)")
    ap.add_argument("--max-offsets-per-trigger", type=int, default=100)
    ap.add_argument("--master", default="local[2,3]", help="local[threads,maxFailures]")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import oncelog.spark

    spark = (SparkSession.builder.master(args.master).appName("oncelog-copy")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    oncelog.spark.register(spark)
    df = (spark.readStream.format("oncelog")
          .option("kafka.bootstrap.servers", args.bootstrap_server)
          .option("subscribe", args.source).option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger)).load())
    q = (df.selectExpr("key", "value", f"'{args.sink}' AS topic").writeStream.format("oncelog")
         .option("kafka.bootstrap.servers", args.bootstrap_server)
         .option("checkpointLocation", args.checkpoint).trigger(processingTime="500 milliseconds")
         .start())
    done = 0
    seen: set[int] = set()
    try:
        while q.isActive:
            for p in q.recentProgress:
                if p["batchId"] not in seen:
                    seen.add(p["batchId"])
                    done += p["numInputRows"]
                    print(f"batch {p['batchId']}: {p['numInputRows']} rows", flush=True)
            if args.until is not None and args.until > 0 and done >= args.until:
                break
            last = q.lastProgress
            if args.until == 0 and last is not None and last["numInputRows"] == 0 \
                    and not q.status["isDataAvailable"] and not q.status["isTriggerActive"]:
                break
            time.sleep(0.2)
        if q.exception() is not None:
            print(f"query failed: {q.exception()}", file=sys.stderr, flush=True)
            return 1
    finally:
        q.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

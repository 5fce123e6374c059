"""The Spark connector's speed against Spark's own IO (issue 19's targets), in one run on this
machine and one DataFrame:

1. batch write: ``df.write.format("oncelog")`` (exactly once) / ``df.write.parquet`` (>= 0.3);
2. batch read: ``spark.read.format("oncelog")...selectExpr("sum(length(value))")`` / the same
   over the Parquet files (>= 0.8);
3. streaming copy, ``trigger(availableNow=True)``, topic to topic through the exactly-once
   ``oncelog`` sink / the same query into ``format("noop")`` (>= 0.5);
4. that exactly-once copy / an at-least-once copy (``foreachBatch`` + ``foreachPartition`` with
   confluent-kafka's Producer, the usual pattern) (>= 0.9);
5. the first micro-batch's time after ``start()``: the session's first query and a later one;
6. end-to-end latency at 20 records/s through the exactly-once sink (median <= 0.3 s).

    .venv/bin/python benchmarks/bench_spark.py [--rows 300000] [--rounds 2] [--only 1,2,...]
        [--png docs/spark_bench.png] [--json docs/spark_bench.json] [--master local[2]]

One SparkSession, one embedded broker (two-phase commit enabled) in this process. The DataFrame
is ``--rows`` rows of ``key`` (10 B: the row's id, zero-padded: Spark's Kafka benchmarks carry a
key, and it lets the check below count distinct ids) and ``value`` (100 B: the id and 89 hex
digits of its SHA-512, so neither Parquet nor anything else finds it compressible), built
from ``spark.range`` and cached before any timing. The streaming figures read a topic of
``--partitions`` partitions holding the same rows (filled with confluent-kafka, untimed).

Throughput is rows per second, the best of ``--rounds`` rounds, the contenders of a figure
alternating their order every round. A streaming copy's time runs from ``start()`` to the
query's end; it is also given without its first micro-batch (when there is more than one:
``--micro-batches`` sets ``maxOffsetsPerTrigger`` to rows / micro-batches). Every exactly-once
output is checked (untimed): read_committed, it holds each id exactly once.

Figure 5's queries copy a small topic (1,000 rows); the first of them runs before any other
Spark work, so it also warms the session up for the rest (it runs, unreported, when 5 is not
asked for). Figure 6 sends 20 records/s, each with its send time, for ``--latency-seconds``
into a query with a processing-time trigger of 0 (micro-batches back to back); a read_committed
consumer of the output takes receive time - send time.

Needs the ``spark`` and ``bench`` extras (``.venv/bin/pip install -e '.[spark,bench]'``;
``scripts/bootstrap.sh`` installs all but matplotlib). Without matplotlib there is no plot
(``--png``), and the figures are still printed and written to ``--json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

from oncelog import Admin, NewTopic
from oncelog.server.embedded import EmbeddedBroker

REPO = Path(__file__).resolve().parent.parent
SOURCE, SMALL = "bench-source", "bench-small"
SMALL_ROWS = 1000
KEY_SQL = "cast(lpad(cast(id AS string), 10, '0') AS binary)"
VALUE_SQL = ("cast(concat(lpad(cast(id AS string), 10, '0'), ':', "
             "substr(sha2(cast(id AS string), 512), 1, 89)) AS binary)")
VALUE_BYTES = 100
FIGURES = {"write": 1, "read": 2, "stream": 3, "alo": 4, "first": 5, "latency": 6}
TARGETS = {"write": 0.3, "read": 0.8, "stream": 0.5, "alo": 0.9, "latency_median_s": 0.3}


def key_of(i: int) -> bytes:
    """Row ``i``'s key, as KEY_SQL makes it."""
    return b"%010d" % i


def value_of(i: int) -> bytes:
    """Row ``i``'s value, as VALUE_SQL makes it."""
    return key_of(i) + b":" + hashlib.sha512(str(i).encode()).hexdigest()[:89].encode()


def spark_session(master: str):
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import oncelog.spark

    spark = (SparkSession.builder.master(master).appName("oncelog-bench-spark")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")  # no progress bars among figures
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    oncelog.spark.register(spark)
    spark.dataSource.register(memory_source())
    return spark


class Bench:
    """The session, the broker, the DataFrame and the runs of each figure."""

    def __init__(self, spark, bootstrap: str, work: Path, args) -> None:
        self.spark, self.bootstrap, self.work, self.args = spark, bootstrap, work, args
        self.n = args.rows
        self._df = None
        self._parquet: Path | None = None
        self._filled: set[str] = set()

    # -- data ----------------------------------------------------------------------------

    def df(self):
        """The DataFrame of the figures, cached (built and counted once, untimed)."""
        if self._df is None:
            self._df = (self.spark.range(0, self.n)
                        .selectExpr(f"{KEY_SQL} AS key", f"{VALUE_SQL} AS value").cache())
            if self._df.count() != self.n:
                raise RuntimeError("the cached DataFrame lost rows")
        return self._df

    def topics(self, *names: str) -> None:
        with Admin(bootstrap_servers=self.bootstrap) as admin:
            admin.create_topics([NewTopic(t, self.args.partitions) for t in names])

    def fill(self, topic: str, n: int) -> None:
        """``topic`` holding rows 0..n-1 of the DataFrame, spread evenly over its partitions
        (written once with confluent-kafka: fast, and not the code measured)."""
        if topic in self._filled:
            return
        from confluent_kafka import Producer

        self.topics(topic)
        failed: list = []
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20})
        for i in range(n):
            while True:
                try:
                    p.produce(topic, value_of(i), key_of(i), partition=i % self.args.partitions,
                              on_delivery=lambda err, _m: err and failed.append(err))
                    break
                except BufferError:
                    p.poll(0.05)
        if p.flush(120) or failed:
            raise RuntimeError(f"filling {topic}: {failed[:3]}")
        self._filled.add(topic)

    def parquet(self) -> Path:
        """A Parquet copy of the DataFrame (figure 1's last, or written here untimed)."""
        if self._parquet is None:
            self._parquet = self.work / "parquet-read"
            self.df().write.parquet(str(self._parquet))
        return self._parquet

    def check_once(self, topic: str, n: int) -> str:
        """'' when ``topic``, read_committed, holds each of the ids 0..n-1 exactly once; else
        what is wrong."""
        row = (self.reader(topic).selectExpr("count(*)", "count(DISTINCT key)", "min(key)",
                                             "max(key)").collect()[0])
        count, distinct, lo, hi = row[0], row[1], bytes(row[2] or b""), bytes(row[3] or b"")
        if (count, distinct, lo, hi) == (n, n, key_of(0), key_of(n - 1)):
            return ""
        return f"{topic}: {count} rows, {distinct} distinct ids, from {lo!r} to {hi!r} (want {n})"

    def reader(self, topic: str):
        return (self.spark.read.format("oncelog").option("kafka.bootstrap.servers",
                                                          self.bootstrap)
                .option("subscribe", topic).load())

    # -- figures 1 and 2 -----------------------------------------------------------------

    def write(self, contender: str, rnd: int) -> dict:
        df = self.df()
        if contender == "oncelog":
            topic = f"write-{rnd}"
            self.topics(topic)
            t = time.perf_counter()
            (df.write.format("oncelog").option("kafka.bootstrap.servers", self.bootstrap)
             .option("topic", topic).mode("append").save())
            secs = time.perf_counter() - t
            return {"secs": secs, "rate": self.n / secs, "problem": self.check_once(topic, self.n)}
        path = self.work / f"parquet-{rnd}"
        t = time.perf_counter()
        df.write.parquet(str(path))
        secs = time.perf_counter() - t
        self._parquet = path
        return {"secs": secs, "rate": self.n / secs, "problem": ""}

    def read(self, contender: str, rnd: int) -> dict:
        if contender == "oncelog":
            self.fill(SOURCE, self.n)
            frame = self.reader(SOURCE)
        elif contender == "memory":
            frame = (self.spark.read.format(MEMORY_SOURCE).option("rows", str(self.n))
                     .option("partitions", str(self.args.partitions)).load())
        else:
            frame = self.spark.read.parquet(str(self.parquet()))
        t = time.perf_counter()
        total = frame.selectExpr("sum(length(value))").collect()[0][0]
        secs = time.perf_counter() - t
        want = self.n * VALUE_BYTES
        problem = "" if total == want else f"sum(length(value)) {total}, want {want}"
        return {"secs": secs, "rate": self.n / secs, "problem": problem}

    # -- figures 3, 4 and 5: streaming copies --------------------------------------------

    def copy(self, sink: str, source: str, n: int, name: str, max_offsets: int | None) -> dict:
        """Copy ``source`` (n rows) with ``trigger(availableNow=True)`` into ``sink``: oncelog
        (exactly once, into a new topic), noop, or alo (at least once, into a new topic)."""
        out = f"{name}-{uuid.uuid4().hex[:8]}"
        if sink != "noop":
            self.topics(out)
        reader = (self.spark.readStream.format("oncelog")
                  .option("kafka.bootstrap.servers", self.bootstrap).option("subscribe", source)
                  .option("startingOffsets", "earliest"))
        if max_offsets:
            reader = reader.option("maxOffsetsPerTrigger", str(max_offsets))
        writer = (reader.load().select("key", "value").writeStream
                  .option("checkpointLocation", str(self.work / "ck" / out))
                  .trigger(availableNow=True))
        if sink == "oncelog":
            writer = (writer.format("oncelog").option("kafka.bootstrap.servers", self.bootstrap)
                      .option("topic", out))
        elif sink == "noop":
            writer = writer.format("noop")
        else:
            writer = writer.foreachBatch(at_least_once_batch(self.bootstrap, out))
        started = time.time()
        query = writer.start()
        if not query.awaitTermination(self.args.query_timeout):
            query.stop()
            raise RuntimeError(f"{name} ({sink}): no end after {self.args.query_timeout} s")
        secs = time.time() - started
        if query.exception() is not None:
            raise RuntimeError(f"{name} ({sink}) failed: {query.exception()}")
        batches = sorted((p for p in query.recentProgress if p["numInputRows"]),
                         key=lambda p: p["batchId"])
        rows = sum(p["numInputRows"] for p in batches)
        r = {"secs": secs, "rate": n / secs, "batches": len(batches),
             "first_s": _end_s(batches[0]) - started if batches else math.nan,
             "rest_rate": math.nan, "problem": ""}
        if len(batches) > 1:
            r["rest_rate"] = (rows - batches[0]["numInputRows"]) / (
                _end_s(batches[-1]) - _end_s(batches[0]))
        if rows != n:
            r["problem"] = f"the query read {rows} rows of {n}"
        elif sink == "oncelog":
            r["problem"] = self.check_once(out, n)
        elif sink == "alo":
            got = self.reader(out).count()
            r["problem"] = "" if got >= n else f"{out}: {got} rows of {n}"
            r["duplicates"] = got - n
        return r

    def stream(self, contender: str, rnd: int) -> dict:
        self.fill(SOURCE, self.n)
        k = self.args.micro_batches
        return self.copy(contender, SOURCE, self.n, f"copy-{contender}-{rnd}",
                         math.ceil(self.n / k) if k > 1 else None)

    def first(self, which: str) -> dict:
        self.fill(SMALL, SMALL_ROWS)
        return self.copy("oncelog", SMALL, SMALL_ROWS, f"first-{which}", None)

    # -- figure 6 -------------------------------------------------------------------------

    def latency(self) -> dict:
        from confluent_kafka import Consumer, Producer, TopicPartition

        tag = uuid.uuid4().hex[:8]
        src, out = f"latency-in-{tag}", f"latency-out-{tag}"
        self.topics(src, out)
        query = (self.spark.readStream.format("oncelog")
                 .option("kafka.bootstrap.servers", self.bootstrap).option("subscribe", src)
                 .option("startingOffsets", "earliest").load().select("key", "value")
                 .writeStream.format("oncelog").option("kafka.bootstrap.servers", self.bootstrap)
                 .option("topic", out).option("checkpointLocation", str(self.work / "ck" / out))
                 .trigger(processingTime="0 seconds").start())
        received: dict[bytes, list[float]] = {}
        stop = threading.Event()
        # fetch.wait.max.ms: the consumer's long poll must not add to what is measured
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{tag}",
                      "isolation.level": "read_committed", "enable.auto.commit": False,
                      "fetch.wait.max.ms": 10})
        c.assign([TopicPartition(out, p, 0) for p in range(self.args.partitions)])

        def consume() -> None:
            while not stop.is_set():
                for m in c.consume(100, 0.05):
                    if m.error() is None:
                        received.setdefault(m.key(), []).append(time.time())

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        sent: dict[bytes, float] = {}

        def send(key: bytes) -> None:
            now = time.time()
            p.produce(src, json.dumps({"sent": now}).encode(), key)
            p.poll(0)
            sent[key] = now

        try:
            # warm up: the query's first micro-batch (start-up) is not what is measured
            deadline = time.monotonic() + self.args.query_timeout
            i = 0
            while not received:
                if time.monotonic() > deadline or not query.isActive:
                    raise RuntimeError(f"latency: nothing came through ({query.exception()})")
                send(b"warm-%d" % i)
                i += 1
                time.sleep(0.5)
            interval, t0 = 1 / self.args.latency_rate, time.monotonic()
            keys = []
            while time.monotonic() - t0 < self.args.latency_seconds:
                keys.append(b"m-%06d" % len(keys))
                send(keys[-1])
                time.sleep(max(0.0, t0 + len(keys) * interval - time.monotonic()))
            p.flush(10)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(k in received for k in keys):
                time.sleep(0.05)
            progress = [q for q in query.recentProgress if q["numInputRows"]]
        finally:
            stop.set()
            consumer.join(5)
            c.close()
            query.stop()
            p.purge()  # nothing left to retry against a broker about to stop
            p.flush(1)
        noop_ms = self.noop_batches(src, p) if self.args.latency_noop else math.nan
        lat = sorted(received[k][0] - sent[k] for k in keys if k in received)
        dup = sum(len(received[k]) - 1 for k in keys if k in received)
        problem = ""
        if len(lat) != len(keys) or dup:
            problem = f"{len(lat)} of {len(keys)} records came through, {dup} duplicates"
        return {"sent": len(keys), "received": len(lat), "duplicates": dup,
                "median_s": statistics.median(lat) if lat else math.nan,
                "p95_s": pct(lat, 0.95) if lat else math.nan,
                "max_s": lat[-1] if lat else math.nan,
                "micro_batches": len(progress),
                "batch_median_ms": statistics.median(
                    q["durationMs"]["triggerExecution"] for q in progress) if progress else 0,
                "noop_batch_median_ms": noop_ms, "problem": problem}

    def noop_batches(self, src: str, p) -> float:
        """The same trickle read by the same source into ``noop`` (no sink at all): the median
        duration of its micro-batches, what Spark itself takes per micro-batch of a Python
        source (latency cannot be below about one and a half of these)."""
        query = (self.spark.readStream.format("oncelog")
                 .option("kafka.bootstrap.servers", self.bootstrap).option("subscribe", src)
                 .option("startingOffsets", "latest").load().select("key", "value")
                 .writeStream.format("noop").trigger(processingTime="0 seconds").start())
        try:
            interval, t0, i = 1 / self.args.latency_rate, time.monotonic(), 0
            while time.monotonic() - t0 < self.args.latency_noop:
                p.produce(src, b"noop", b"noop-%06d" % i)
                p.poll(0)
                i += 1
                time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            progress = [q for q in query.recentProgress if q["numInputRows"]][1:]
        finally:
            query.stop()
        return statistics.median(q["durationMs"]["triggerExecution"]
                                 for q in progress) if progress else math.nan


MEMORY_SOURCE = "bench_memory"


def memory_source():
    """A Python data source that yields ``rows`` values of VALUE_BYTES from memory, as Arrow
    batches over ``partitions`` tasks: the floor of Spark's Python Data Source API (planning
    round trips, Python workers, Arrow to the JVM), which no Python source can beat."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class MemoryReader(DataSourceReader):
        def __init__(self, rows: int, partitions: int) -> None:
            self.rows, self.parts = rows, partitions

        def partitions(self):
            return [InputPartition(i) for i in range(self.parts)]

        def read(self, partition):
            n = self.rows // self.parts + (partition.value < self.rows % self.parts)
            value = b"v" * VALUE_BYTES
            for start in range(0, n, 50_000):
                yield pa.RecordBatch.from_arrays(
                    [pa.array([value] * min(50_000, n - start), pa.binary())], names=["value"])

    class MemorySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return MEMORY_SOURCE

        def schema(self) -> str:
            return "value binary"

        def reader(self, schema):
            return MemoryReader(int(self.options["rows"]), int(self.options["partitions"]))

    return MemorySource


def at_least_once_batch(bootstrap: str, topic: str):
    """foreachBatch function: every task of the batch sends its rows with a confluent-kafka
    Producer and flushes (at least once: a retried task or batch sends its rows again)."""

    def write_partition(rows) -> None:
        from confluent_kafka import Producer

        failed: list = []
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for i, r in enumerate(rows):
            while True:
                try:
                    p.produce(topic, bytes(r.value), bytes(r.key),
                              on_delivery=lambda err, _m: err and failed.append(err))
                    break
                except BufferError:  # the local queue is full: serve delivery reports
                    p.poll(0.05)
            if i % 1000 == 0:
                p.poll(0)
        if p.flush(120) or failed:
            raise RuntimeError(f"at-least-once write to {topic} failed: {failed[:3]}")

    def write_batch(df, batch_id: int) -> None:
        df.foreachPartition(write_partition)

    return write_batch


def _end_s(p: dict) -> float:
    """A progress report's trigger end, in seconds (its timestamp is the trigger's start)."""
    start = datetime.fromisoformat(p["timestamp"]).timestamp()
    return start + p["durationMs"]["triggerExecution"] / 1000


def _plain(value):
    """``value`` for JSON: NaN (not JSON) as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def pct(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of sorted ``values``."""
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]


def rounds(label: str, run, contenders: tuple[str, ...], n_rounds: int,
           failed: dict[str, str]) -> dict[str, list]:
    """Every contender once per round, the order reversed every other round; prints each. A
    contender that fails is named in ``failed`` and left out of the later rounds (its list
    stays empty): the others are still measured."""
    out: dict[str, list] = {c: [] for c in contenders}
    for rnd in range(n_rounds):
        for c in contenders if rnd % 2 == 0 else contenders[::-1]:
            if f"{label} {c}" in failed:
                continue
            try:
                r = run(c, rnd)
            except Exception as exc:  # noqa: BLE001 (what the connector meets: report, go on)
                failed[f"{label} {c}"] = reason(exc)
                print(f"  {label} round {rnd + 1} {c:8s} FAILED: {reason(exc)}", flush=True)
                continue
            out[c].append(r)
            extra = ""
            if "batches" in r:
                extra = (f"  {r['batches']} micro-batches, first {r['first_s']:5.1f} s after "
                         f"start()")
                if r["batches"] > 1:
                    extra += f", then {r['rest_rate']:9,.0f} rows/s"
            check = f"  PROBLEM: {r['problem']}" if r["problem"] else ""
            print(f"  {label} round {rnd + 1} {c:8s} {r['rate']:10,.0f} rows/s "
                  f"({r['secs']:6.2f} s){extra}{check}", flush=True)
    return out


def best(runs: list[dict], key: str = "rate") -> float:
    values = [r[key] for r in runs if not math.isnan(r[key])]
    return max(values) if values else math.nan


def parse_only(text: str | None) -> set[str]:
    if not text:
        return set(FIGURES)
    names = {str(v): k for k, v in FIGURES.items()}
    out = set()
    for part in text.split(","):
        part = part.strip().lower()
        if part not in FIGURES and part not in names:
            raise SystemExit(f"--only: {part!r} is none of {', '.join(FIGURES)} (or 1-6)")
        out.add(names.get(part, part))
    return out


def table(fig: dict) -> list[tuple]:
    """(figure, oncelog, reference, ratio, target, ok) rows from the measured figures."""
    rows = []

    def ratio_row(label, ref_label, a, b, target):
        ratio = a / b if b else math.nan
        ok = "" if target is None else "NO" if math.isnan(ratio) or ratio < target else "yes"
        rows.append((label, "FAILED" if math.isnan(a) else f"{a:,.0f} rows/s",
                     "FAILED" if math.isnan(b) else f"{b:,.0f} rows/s ({ref_label})",
                     "" if math.isnan(ratio) else f"{ratio:.2f}",
                     "" if target is None else f">= {target}", ok))

    if "write" in fig:
        f = fig["write"]
        ratio_row("1 batch write, exactly once", "Parquet", f["oncelog"], f["parquet"],
                  TARGETS["write"])
    if "read" in fig:
        f = fig["read"]
        ratio_row("2 batch read, sum(length(value))", "Parquet", f["oncelog"],
                  f["parquet"], TARGETS["read"])
        if "memory" in f:
            ratio_row("  Python source from memory (API floor)", "Parquet", f["memory"],
                      f["parquet"], None)
    if "stream" in fig:
        f = fig["stream"]
        ratio_row("3 streaming copy, availableNow", "noop", f["oncelog"], f["noop"],
                  TARGETS["stream"])
        if not math.isnan(f["oncelog_rest"]) and not math.isnan(f["noop_rest"]):
            ratio_row("  without the first micro-batch", "noop", f["oncelog_rest"],
                      f["noop_rest"], None)
        elif f["micro_batches"]:
            rows.append(("  without the first micro-batch",
                         f"n/a: {f['micro_batches']} micro-batch(es)", "", "", "", ""))
    if "alo" in fig:
        f = fig["alo"]
        ratio_row("4 exactly-once / at-least-once copy", "at least once", f["oncelog"],
                  f["alo"], TARGETS["alo"])
    if "first" in fig:
        f = fig["first"]
        rows.append(("5 first micro-batch after start()", f"{f['first_query_s']:.1f} s (first)",
                     f"{f['later_query_s']:.1f} s (a later query)", "", "", ""))
    if "latency" in fig:
        f = fig["latency"]
        target = TARGETS["latency_median_s"]
        rows.append((f"6 latency at {f['rate']:g} records/s", f"median {f['median_s']:.3f} s",
                     f"p95 {f['p95_s']:.3f} s", "", f"median <= {target}",
                     "yes" if f["median_s"] <= target else "NO"))
        if not math.isnan(f.get("noop_batch_median_ms", math.nan)):
            rows.append(("  micro-batch, median", f"{f['batch_median_ms']:.0f} ms",
                         f"{f['noop_batch_median_ms']:.0f} ms (noop sink)", "", "", ""))
    return rows


def plot(fig: dict, path: Path, title: str) -> str:
    """A bar chart of rows/s (oncelog vs Spark's reference) to ``path``; '' or why not."""
    try:
        import matplotlib
    except ImportError:
        return ("matplotlib is missing: no plot (.venv/bin/pip install -e '.[bench]' "
                "installs it)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(name, label, ref, fig[name]["oncelog"], fig[name][refkey])
              for name, label, ref, refkey in (
                  ("write", "batch write", "Parquet write", "parquet"),
                  ("read", "batch read\nsum(length(value))", "Parquet read", "parquet"),
                  ("stream", "streaming copy\navailableNow", "noop sink", "noop"))
              if name in fig]
    if not groups:
        return "no write, read or streaming figure to plot"
    fig_, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    width = 0.3
    for i, (name, _label, ref, ours, theirs) in enumerate(groups):
        bars = [(ours, "#d95f02", "oncelog"), (theirs, "#7570b3", ref)]
        if name == "read" and not math.isnan(fig["read"].get("memory", math.nan)):
            # what any Python data source costs: the same values handed over from memory
            bars.append((fig["read"]["memory"], "#999999", "Python source\nfrom memory"))
        for k, (value, color, text) in enumerate(bars):
            dx = (k - (len(bars) - 1) / 2) * width
            failed = math.isnan(value)  # no bar: the run failed
            value = 0.0 if failed else value
            ax.bar(i + dx, value, width, color=color)
            ax.annotate(f"{'FAILED' if failed else f'{value / 1000:,.0f}k'}\n{text}",
                        (i + dx, value), ha="center", va="bottom", fontsize=7)
        ratio = ours / theirs
        ax.annotate("ratio n/a" if math.isnan(ratio) else f"ratio {ratio:.2f}", (i, 0),
                    xytext=(0, -42),
                    textcoords="offset points", ha="center", fontsize=9, weight="bold")
    ax.set_xticks(range(len(groups)), [g[1] for g in groups])
    ax.set_ylabel("rows/s (best of rounds)")
    top = max((v for g in groups for v in g[3:] if not math.isnan(v)), default=0.0)
    top = max(top, fig.get("read", {}).get("memory", 0.0) or 0.0)
    ax.set_ylim(0, top * 1.25 or 1.0)
    ax.set_title(title, fontsize=9)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
        lambda v, _p: f"{v / 1e6:.1f}M" if v >= 1e6 else f"{v / 1e3:.0f}k"))
    fig_.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig_.savefig(path)
    plt.close(fig_)
    return ""


def commit_of_checkout() -> str:
    """The checkout measured: its commit, and the last one that changed src/ (the connector)."""

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True,
                              check=True).stdout.strip()

    try:
        src_dirty = "-dirty" if git("status", "--porcelain", "--", "src") else ""
        return (f"{git('describe', '--always', '--dirty')} "
                f"(src/ {git('log', '-1', '--format=%h', '--', 'src')}{src_dirty})")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def reason(exc: Exception) -> str:
    """The gist of ``exc``: for Spark's, the Python worker's exception when it names one."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    return f"{type(exc).__name__}: {(named or lines or [''])[-1 if named else 0][:300]}"


def measure(b: Bench, only: set[str], fig: dict, raw: dict, failed: dict[str, str]) -> None:
    """The figures in ``only`` into ``fig`` (best of rounds) and ``raw`` (every run); a figure
    that fails is named in ``failed`` with its error, and the others are still measured."""
    args = b.args

    def attempt(name: str, step) -> None:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 (whatever a figure meets: report, go on)
            failed[name] = reason(exc)
            print(f"  {name} FAILED: {failed[name]}", flush=True)

    def first() -> None:
        # The session's first query, before any other Spark work (figure 5, or a warm-up).
        a = b.first("a")
        print(f"5 first query of the session: first micro-batch {a['first_s']:.1f} s "
              f"after start(), query {a['secs']:.1f} s", flush=True)
        if "first" in only:
            later = b.first("b")
            print(f"5 a later query: first micro-batch {later['first_s']:.1f} s after "
                  f"start(), query {later['secs']:.1f} s", flush=True)
            fig["first"] = {"first_query_s": a["first_s"], "later_query_s": later["first_s"],
                            "rows": SMALL_ROWS}
            raw["first"] = [a, later]

    def batch(name: str, run) -> None:
        print(f"{FIGURES[name]} batch {name}", flush=True)
        # The read also times a Python data source that only hands Spark the same values from
        # memory: what any source of Spark's Python Data Source API costs, reading nothing.
        contenders = ("oncelog", "parquet", "memory") if name == "read" else ("oncelog",
                                                                              "parquet")
        raw[name] = rounds(name, run, contenders, args.rounds, failed)
        fig[name] = {c: best(r) for c, r in raw[name].items()}

    def stream() -> None:
        sinks = tuple(s for s, f in (("oncelog", {"stream", "alo"}), ("noop", {"stream"}),
                                     ("alo", {"alo"})) if f & only)
        print("3, 4 streaming copy", flush=True)
        raw["stream"] = runs = rounds("copy", b.stream, sinks, args.rounds, failed)
        if "stream" in only:
            fig["stream"] = {"oncelog": best(runs["oncelog"]), "noop": best(runs["noop"]),
                             "oncelog_rest": best(runs["oncelog"], "rest_rate"),
                             "noop_rest": best(runs["noop"], "rest_rate"),
                             "micro_batches": max((r["batches"] for r in runs["oncelog"]),
                                                  default=0)}
        if "alo" in only:
            fig["alo"] = {"oncelog": best(runs["oncelog"]), "alo": best(runs["alo"]),
                          "alo_duplicates": max((r["duplicates"] for r in runs["alo"]),
                                                default=0)}
        if "first" in fig:
            fig["first"]["later_queries_s"] = [r["first_s"] for r in runs.get("oncelog", [])]

    def latency() -> None:
        print(f"6 latency at {args.latency_rate:g} records/s for {args.latency_seconds:g} s",
              flush=True)
        lat = b.latency()
        fig["latency"] = {**lat, "rate": args.latency_rate}
        print(f"  median {lat['median_s']:.3f} s, p95 {lat['p95_s']:.3f} s, max "
              f"{lat['max_s']:.3f} s, {lat['received']}/{lat['sent']} records in "
              f"{lat['micro_batches']} micro-batches (median {lat['batch_median_ms']:.0f} ms "
              f"each; the same source into noop: {lat['noop_batch_median_ms']:.0f} ms)",
              flush=True)

    attempt("first" if "first" in only else "warm-up", first)
    for name in ("write", "read"):
        if name in only:
            attempt(name, lambda name=name: batch(name, getattr(b, name)))
    if only & {"stream", "alo"}:
        attempt("stream" if "stream" in only else "alo", stream)
    if "latency" in only:
        attempt("latency", latency)


def main(argv: list[str] | None = None) -> int:
    class Formatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
        pass

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Formatter)
    ap.add_argument("--rows", type=int, default=300_000, help="rows of the DataFrame")
    ap.add_argument("--rounds", type=int, default=2, help="each figure is the best of this many rounds")
    ap.add_argument("--only", default=None,
                    help="figures to measure, comma-separated: 1-6 or write, read, stream, alo, "
                         "first, latency; None: all")
    ap.add_argument("--png", default=str(REPO / "docs" / "spark_bench.png"),
                    help="the plot ('': none)")
    ap.add_argument("--json", default=str(REPO / "docs" / "spark_bench.json"),
                    help="the figures and every run's ('': none)")
    ap.add_argument("--master", default="local[2]", help="Spark's master")
    ap.add_argument("--partitions", type=int, default=2, help="partitions of every topic")
    ap.add_argument("--micro-batches", type=int, default=3,
                    help="streaming copies (3, 4) read maxOffsetsPerTrigger = rows / this "
                         "(1: no limit, one micro-batch)")
    ap.add_argument("--latency-seconds", type=float, default=20.0,
                    help="how long figure 6 measures")
    ap.add_argument("--latency-rate", type=float, default=20.0, help="records/s for figure 6")
    ap.add_argument("--latency-noop", type=float, default=10.0,
                    help="seconds of the same trickle into noop (Spark's own micro-batch "
                         "time, figure 6's floor); 0: none")
    ap.add_argument("--query-timeout", type=float, default=600.0,
                    help="give up on a streaming query after this many seconds")
    ap.add_argument("--work-dir", default=None,
                    help="where Parquet files and checkpoints go; None: a new temporary directory")
    args = ap.parse_args(argv)
    only = parse_only(args.only)
    try:
        import confluent_kafka  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise SystemExit(f"{exc.name} is missing: .venv/bin/pip install -e '.[spark,bench]'")
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    spark = spark_session(args.master)
    print(f"{args.rows:,} rows of key 10 B + value {VALUE_BYTES} B, best of {args.rounds} "
          f"rounds, {args.partitions} partitions per topic, {args.master}; Spark started in "
          f"{time.perf_counter() - t0:.1f} s; checkout {commit_of_checkout()}", flush=True)
    fig: dict = {}
    raw: dict = {}
    problems: list[str] = []
    failed: dict[str, str] = {}
    try:
        with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true"}) as broker, \
                tempfile.TemporaryDirectory(prefix="bench-spark-", dir=args.work_dir) as work:
            b = Bench(spark, broker.bootstrap_servers, Path(work), args)
            measure(b, only, fig, raw, failed)
            for runs in raw.values():
                for group in (runs.values() if isinstance(runs, dict) else [runs]):
                    problems += [r["problem"] for r in group if r["problem"]]
            if "latency" in fig and fig["latency"]["problem"]:
                problems.append(fig["latency"]["problem"])
    finally:
        spark.stop()
    rows = table(fig) + [(f"{FIGURES.get(name, '')} {name}".strip(), "FAILED", why[:70], "", "",
                          "NO") for name, why in failed.items()
                          if " " not in name]  # a contender's failure: FAILED in its row
    heads = ("figure", "oncelog", "reference", "ratio", "target", "ok?")
    widths = [max(len(str(r[i])) for r in [heads, *rows]) for i in range(len(heads))]
    print()
    for r in [heads, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    print("exactly once: " + ("every check passed" if not problems else
                              "PROBLEMS: " + "; ".join(problems)))
    for name, why in failed.items():
        print(f"{name} failed: {why}")
    print(f"total run time {time.perf_counter() - t0:.0f} s")
    stamp = datetime.now().astimezone().isoformat(timespec="seconds")
    title = (f"oncelog Spark connector vs Spark's own IO: {args.rows:,} rows x 110 B, "
             f"{args.master}, best of {args.rounds}\n{stamp}, checkout {commit_of_checkout()}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(_plain(
            {"when": stamp, "checkout": commit_of_checkout(), "machine": platform.platform(),
             "cpus": os.cpu_count(), "load_average_before": load_before,
             "load_average_after": os.getloadavg(), "args": vars(args), "figures": fig,
             "targets": TARGETS, "runs": raw, "problems": problems, "failed": failed}),
            indent=1, default=str, allow_nan=False) + "\n")
        print(f"figures written to {args.json}")
    if args.png:
        why_not = plot(fig, Path(args.png), title)
        print(why_not or f"plot written to {args.png}")
    return 1 if problems or failed else 0


if __name__ == "__main__":
    sys.exit(main())

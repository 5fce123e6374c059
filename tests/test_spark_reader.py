"""The oncelog PySpark source with real Spark (local[2]): a batch read and a streaming read of a
topic with committed, aborted and open transactions."""

from __future__ import annotations

import os
import sys
import time

import pytest

pyspark = pytest.importorskip("pyspark")

from oncelog import Admin, NewTopic, Producer  # noqa: E402
from oncelog.server.embedded import EmbeddedBroker  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import oncelog.spark

    s = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    oncelog.spark.register(s)
    yield s
    s.stop()


@pytest.fixture
def topic_with_transactions():
    with EmbeddedBroker() as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("in", 2)])
        p = Producer(bootstrap_servers=b.bootstrap_servers, transactional_id="w", linger_ms=0)
        p.init_transactions()
        for i in range(6):
            p.begin_transaction()
            p.send("in", f"v{i}".encode(), key=b"k", partition=i % 2,
                   headers=[("h", b"1")])
            (p.commit_transaction if i % 3 else p.abort_transaction)()
        yield b, p
        p.close()


def test_batch_read_skips_aborted_records_and_stops_at_the_lso(spark, topic_with_transactions):
    b, p = topic_with_transactions
    p.begin_transaction()
    p.send("in", b"open", partition=0)
    p.flush()
    df = (spark.read.format("oncelog").option("kafka.bootstrap.servers", b.bootstrap_servers)
          .option("subscribe", "in").option("startingOffsets", "earliest")
          .option("includeHeaders", "true").load())
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    rows = sorted((r.value, r.partition, r.offset, r.key, [tuple(h) for h in r.headers])
                  for r in df.collect())
    assert rows == [(b"v1", 1, 0, b"k", [("h", b"1")]), (b"v2", 0, 2, b"k", [("h", b"1")]),
                    (b"v4", 0, 4, b"k", [("h", b"1")]), (b"v5", 1, 4, b"k", [("h", b"1")])]
    p.abort_transaction()


def test_stream_read_waits_for_open_transactions_and_limits_batches(spark, tmp_path,
                                                                    topic_with_transactions):
    b, p = topic_with_transactions
    p.begin_transaction()
    p.send("in", b"open", partition=0)
    p.flush()
    df = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", b.bootstrap_servers)
          .option("subscribe", "in").option("startingOffsets", "earliest")
          .option("maxOffsetsPerTrigger", "3").load())
    q = (df.selectExpr("CAST(value AS STRING) v", "partition", "offset").writeStream
         .format("memory").queryName("streamed")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        def seen():
            return sorted(tuple(r) for r in spark.sql("select * from streamed").collect())

        deadline = time.monotonic() + 60
        while len(seen()) < 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert seen() == [("v1", 1, 0), ("v2", 0, 2), ("v4", 0, 4), ("v5", 1, 4)]
        p.send("in", b"after", partition=0)
        p.commit_transaction()
        while len(seen()) < 6 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert ("open", 0, 6) in seen() and ("after", 0, 7) in seen()
        assert all(x["numInputRows"] <= 3 for x in q.recentProgress)
    finally:
        q.stop()

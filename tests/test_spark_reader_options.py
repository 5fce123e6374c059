"""The rest of Spark's Kafka source options through a real Spark session (local[2]): offsets by
timestamp, minPartitions / maxRecordsPerPartition, minOffsetsPerTrigger / maxTriggerDelay,
maxOffsetsPerTrigger under trigger(availableNow=True), a topic that does not exist, the latest
offset in the query's progress, and refused options.

One SparkSession and one broker for the module; every test has its own topics."""

from __future__ import annotations

import json
import time

import pytest

pyspark = pytest.importorskip("pyspark")

from support.spark_session import local_spark
from support.waiting import wait_until

from oncelog import Admin, NewTopic, Producer
from oncelog.server.embedded import EmbeddedBroker

pytestmark = [pytest.mark.slow, pytest.mark.spark]

# Record timestamps an hour ago and later (retention must not take them).
T = (int(time.time()) - 3600) * 1000


@pytest.fixture(scope="module")
def spark():
    with local_spark() as s:
        yield s


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with EmbeddedBroker(data_dir=tmp_path_factory.mktemp("data")) as b:
        yield b


def produce(b: EmbeddedBroker, topic: str, partitions: int,
            records: list[tuple[int, str, int]]) -> None:
    """Create ``topic``, then send (partition, value, timestamp offset from T) in order."""
    with Admin(bootstrap_servers=b.bootstrap_servers) as a:
        a.create_topics([NewTopic(topic, partitions)])
    send(b, topic, records)


def send(b: EmbeddedBroker, topic: str, records: list[tuple[int, str, int]]) -> None:
    with Producer(bootstrap_servers=b.bootstrap_servers, linger_ms=0) as p:
        for part, value, ts in records:
            p.send(topic, value.encode(), partition=part, timestamp_ms=T + ts)


def read(spark, b: EmbeddedBroker, **options: str):
    return (spark.read.format("oncelog").option("kafka.bootstrap.servers", b.bootstrap_servers)
            .options(**options).load())


def values(df) -> list[tuple[int, int, str]]:
    """(partition, offset, value), sorted."""
    return sorted((r.partition, r.offset, r.value.decode())
                  for r in df.select("partition", "offset", "value").collect())


def error(action) -> str:
    with pytest.raises(Exception) as info:
        action()
    return str(info.value)


def stream(spark, b: EmbeddedBroker, name: str, checkpoint, available_now: bool = False,
           **options: str):
    df = (spark.readStream.format("oncelog")
          .option("kafka.bootstrap.servers", b.bootstrap_servers)
          .options(**options).load())
    w = (df.selectExpr("partition", "offset", "CAST(value AS STRING) value").writeStream
         .format("memory").queryName(name).option("checkpointLocation", str(checkpoint)))
    if available_now:
        w = w.trigger(availableNow=True)
    return w.start()


def seen(spark, name: str) -> list[tuple[int, int, str]]:
    return sorted(tuple(r) for r in spark.sql(f"select * from {name}").collect())


def test_batch_reads_by_timestamp_with_sparks_precedence_and_errors(spark, broker):
    # partition 0: a@100 b@200 c@300; partition 1: d@150 e@250
    produce(broker, "ts", 2, [(0, "a", 100), (1, "d", 150), (0, "b", 200), (1, "e", 250),
                              (0, "c", 300)])
    # the first record at or after the timestamp, per partition; startingOffsets is ignored
    assert values(read(spark, broker, subscribe="ts", startingTimestamp=str(T + 200),
                       startingOffsets='{"ts":{"0":0,"1":0}}')) == [
        (0, 1, "b"), (0, 2, "c"), (1, 1, "e")]
    # ends before the first record at or after endingTimestamp
    assert values(read(spark, broker, subscribe="ts", endingTimestamp=str(T + 250))) == [
        (0, 0, "a"), (0, 1, "b"), (1, 0, "d")]
    assert values(read(spark, broker, subscribe="ts",
                       startingOffsetsByTimestamp=f'{{"ts":{{"0":{T + 150},"1":{T + 150}}}}}',
                       endingOffsetsByTimestamp=f'{{"ts":{{"0":{T + 300},"1":{T + 999}}}}}'
                       )) == [(0, 1, "b"), (1, 0, "d"), (1, 1, "e")]  # 999: no match, latest
    # a starting timestamp after every record of a partition: an error by default ...
    assert (f"No offset matched from request of topic-partition ts-1 and timestamp {T + 260}"
            in error(lambda: read(spark, broker, subscribe="ts",
                                  startingTimestamp=str(T + 260)).collect()))
    # ... or that partition starts at the latest offset
    assert values(read(spark, broker, subscribe="ts", startingTimestamp=str(T + 260),
                       startingOffsetsByTimestampStrategy="latest")) == [(0, 2, "c")]
    assert "startingOffsetsByTimestamp names partitions this query does not read: ts-7" in error(
        lambda: read(spark, broker, subscribe="ts",
                     startingOffsetsByTimestamp='{"ts":{"7":1}}').collect())


def test_min_partitions_and_max_records_per_partition_split_the_read(spark, broker):
    produce(broker, "split", 2, [(0, f"a{i}", i) for i in range(12)]
            + [(1, f"b{i}", i) for i in range(3)])
    everything = [(0, i, f"a{i}") for i in range(12)] + [(1, i, f"b{i}") for i in range(3)]
    plain = read(spark, broker, subscribe="split")
    assert plain.rdd.getNumPartitions() == 2
    # partition 1 (3 offsets) keeps one task, partition 0 takes the other three
    split = read(spark, broker, subscribe="split", minPartitions="4")
    assert split.rdd.getNumPartitions() == 4
    assert values(split) == everything
    capped = read(spark, broker, subscribe="split", maxRecordsPerPartition="5")
    assert capped.rdd.getNumPartitions() == 4  # 12 -> 4 4 4, 3 -> 3
    assert values(capped) == everything


def test_a_missing_topic_or_an_unmatched_pattern_reads_nothing(spark, broker, tmp_path):
    for options in ({"subscribe": "no-such-topic"}, {"subscribePattern": "no-such-.*"}):
        df = read(spark, broker, **options)
        assert df.count() == 0
        assert df.collect() == []
    q = stream(spark, broker, "missing", tmp_path / "ck", available_now=True,
               subscribe="no-such-topic", startingOffsets="earliest")
    try:
        assert q.awaitTermination(120)
        assert q.exception() is None
        assert seen(spark, "missing") == []
    finally:
        q.stop()


def test_a_stream_starts_by_timestamp_and_available_now_splits_its_backlog(spark, broker,
                                                                         tmp_path):
    produce(broker, "backlog", 2, [(i % 2, f"v{i}", i) for i in range(20)])
    # a new stream starts at its records from T + 4 on (v4 on: offset 2 of each partition)
    q = stream(spark, broker, "backlog", tmp_path / "ck", available_now=True,
               subscribe="backlog", startingTimestamp=str(T + 4), maxOffsetsPerTrigger="6",
               minPartitions="4")
    try:
        assert q.awaitTermination(180)
        assert q.exception() is None
        progress = q.recentProgress
    finally:
        q.stop()
    assert seen(spark, "backlog") == sorted((i % 2, i // 2, f"v{i}") for i in range(4, 20))
    sizes = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert sum(sizes) == 16 and max(sizes) <= 6 and len(sizes) >= 3
    # the source's latest offset in the progress (reportLatestOffset): what was there
    last = [p for p in progress if p["numInputRows"]][-1]["sources"][0]
    assert json.loads(last["latestOffset"]) == {"backlog": {"0": 10, "1": 10}}
    assert json.loads(last["endOffset"]) == {"backlog": {"0": 10, "1": 10}}


def test_min_offsets_per_trigger_waits_for_enough_offsets_or_max_trigger_delay(
        spark, broker, tmp_path):
    produce(broker, "trickle", 1, [(0, "first", 0), (0, "second", 1)])
    q = stream(spark, broker, "trickle", tmp_path / "ck", subscribe="trickle",
               startingOffsets="earliest", minOffsetsPerTrigger="5", maxTriggerDelay="8s")
    try:
        # the first trigger never waits (as Spark's): both records
        wait_until(lambda: len(seen(spark, "trickle")) == 2, 90, "the first micro-batch")
        fired = time.monotonic()
        send(broker, "trickle", [(0, f"late{i}", 10) for i in range(3)])
        time.sleep(2)  # 3 < 5 offsets: skipped, while maxTriggerDelay has not passed
        assert len(seen(spark, "trickle")) == 2
        # then maxTriggerDelay passes and the 3 come in one micro-batch
        wait_until(lambda: len(seen(spark, "trickle")) == 5, 60, "the delayed micro-batch")
        assert time.monotonic() - fired >= 5  # 8 s after the first batch was planned
        send(broker, "trickle", [(0, f"more{i}", 20) for i in range(5)])
        wait_until(lambda: len(seen(spark, "trickle")) == 10, 60, "5 offsets: no wait")
        def sizes() -> list[int]:
            return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]

        # a micro-batch's rows are in the memory sink a moment before its progress report
        wait_until(lambda: sum(sizes()) == 10, 30, "the last progress report")
        assert sizes() == [2, 3, 5]
        # the progress names the source by Spark's Python data source class only (PySpark
        # gives a Python source no say in it)
        assert "PythonMicroBatchStream" in q.lastProgress["sources"][0]["description"]
    finally:
        q.stop()


def test_refused_options_fail_before_any_task(spark, broker):
    assert "unknown option 'startingoffset' for the oncelog source (did you mean " \
        "startingOffsets?)" in error(
            lambda: read(spark, broker, subscribe="x", startingOffset="earliest").collect())
    assert "unknown consumer config 'max.poll.record' (did you mean 'max.poll.records'?)" in \
        error(lambda: read(spark, broker, subscribe="x",
                           **{"kafka.max.poll.record": "5"}).collect())
    assert "Kafka option 'auto.offset.reset' is not supported" in error(
        lambda: read(spark, broker, subscribe="x",
                     **{"kafka.auto.offset.reset": "earliest"}).collect())

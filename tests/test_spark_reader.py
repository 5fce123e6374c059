"""The oncelog PySpark source with real Spark (local[2]): batch and streaming reads of topics with
committed, aborted and open transactions, and the reader's options (Spark's Kafka source's)
driven through Spark.

One SparkSession and one broker for the module; every test has its own topics and
transactional ids."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest

pyspark = pytest.importorskip("pyspark")

from support.spark_session import local_spark

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.server.embedded import EmbeddedBroker

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    with local_spark() as s:
        yield s


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"log.retention.check.interval.ms": "200"}) as b:
        yield b


def create(b: EmbeddedBroker, *topics: NewTopic) -> None:
    with Admin(bootstrap_servers=b.bootstrap_servers) as a:
        a.create_topics(list(topics))


def plain_producer(b: EmbeddedBroker) -> Producer:
    return Producer(bootstrap_servers=b.bootstrap_servers, linger_ms=0)


def txn_producer(b: EmbeddedBroker, txn_id: str) -> Producer:
    p = Producer(bootstrap_servers=b.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
    p.init_transactions()
    return p


def with_transactions(b: EmbeddedBroker, topic: str) -> Producer:
    """``topic`` (2 partitions): v0..v5 one per transaction, alternating partitions, v0 and v3
    aborted. Partition 0: v0 (aborted) 0, marker 1, v2 2, marker 3, v4 4, marker 5;
    partition 1: v1 0, marker 1, v3 (aborted) 2, marker 3, v5 4, marker 5."""
    create(b, NewTopic(topic, 2))
    p = txn_producer(b, f"{topic}-w")
    for i in range(6):
        p.begin_transaction()
        p.send(topic, f"v{i}".encode(), key=b"k", partition=i % 2, headers=[("h", b"1")])
        (p.commit_transaction if i % 3 else p.abort_transaction)()
    return p


def read(spark, b: EmbeddedBroker, **options: str):
    return (spark.read.format("oncelog").option("kafka.bootstrap.servers", b.bootstrap_servers)
            .options(**options).load())


def rows(df) -> list[tuple[str, str, int, int]]:
    """(topic, value, partition, offset), sorted."""
    return sorted((r.topic, r.value.decode(), r.partition, r.offset)
                  for r in df.select("topic", "value", "partition", "offset").collect())


def wait_until(cond: Callable[[], object], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        time.sleep(0.3)


def offsets(b: EmbeddedBroker, topic: str, partitions: int) -> tuple[list[int], list[int]]:
    c = Consumer(bootstrap_servers=b.bootstrap_servers)
    try:
        tps = [TopicPartition(topic, i) for i in range(partitions)]
        first, end = c.beginning_offsets(tps), c.end_offsets(tps)
        return [first[tp] for tp in tps], [end[tp] for tp in tps]
    finally:
        c.close()


# -- transactions --------------------------------------------------------------------------


def test_batch_read_skips_aborted_records_and_stops_at_the_lso(spark, broker):
    p = with_transactions(broker, "lso")
    try:
        p.begin_transaction()
        p.send("lso", b"open", partition=0)
        p.flush()
        df = read(spark, broker, subscribe="lso", startingOffsets="earliest",
                  includeHeaders="true")
        assert [f.name for f in df.schema.fields] == [
            "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
            "headers"]
        got = sorted((r.value, r.partition, r.offset, r.key, [tuple(h) for h in r.headers])
                     for r in df.collect())
        assert got == [(b"v1", 1, 0, b"k", [("h", b"1")]), (b"v2", 0, 2, b"k", [("h", b"1")]),
                       (b"v4", 0, 4, b"k", [("h", b"1")]), (b"v5", 1, 4, b"k", [("h", b"1")])]
        p.abort_transaction()
    finally:
        p.close()


def test_stream_read_waits_for_open_transactions_and_limits_batches(spark, broker, tmp_path):
    p = with_transactions(broker, "wait")
    try:
        p.begin_transaction()
        p.send("wait", b"open", partition=0)
        p.flush()
        df = (spark.readStream.format("oncelog")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", "wait").option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "3").load())
        q = (df.selectExpr("CAST(value AS STRING) v", "partition", "offset").writeStream
             .format("memory").queryName("streamed")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            def seen():
                return sorted(tuple(r) for r in spark.sql("select * from streamed").collect())

            wait_until(lambda: len(seen()) >= 4, what="the committed records")
            time.sleep(1)  # an open transaction's record would show up by now
            assert seen() == [("v1", 1, 0), ("v2", 0, 2), ("v4", 0, 4), ("v5", 1, 4)]
            p.send("wait", b"after", partition=0)
            p.commit_transaction()
            wait_until(lambda: len(seen()) >= 6, what="the transaction once committed")
            assert seen() == [("after", 0, 7), ("open", 0, 6), ("v1", 1, 0), ("v2", 0, 2),
                              ("v4", 0, 4), ("v5", 1, 4)]
            assert all(x["numInputRows"] <= 3 for x in q.recentProgress)
        finally:
            q.stop()
    finally:
        p.close()


def test_isolation_level_read_uncommitted_returns_aborted_and_open_records(spark, broker):
    p = with_transactions(broker, "iso")
    plain = plain_producer(broker)
    try:
        p.begin_transaction()
        p.send("iso", b"open", partition=0)
        p.flush()
        plain.send("iso", b"plain", partition=0)  # after the open transaction's first record
        plain.flush()
        uncommitted = rows(read(spark, broker, subscribe="iso", startingOffsets="earliest",
                                **{"kafka.isolation.level": "read_uncommitted"}))
        committed = rows(read(spark, broker, subscribe="iso", startingOffsets="earliest"))
        explicit = rows(read(spark, broker, subscribe="iso", startingOffsets="earliest",
                             **{"kafka.isolation.level": "read_committed"}))
        # Every data record, aborted and open ones too; never a control record (marker).
        assert uncommitted == [("iso", "open", 0, 6), ("iso", "plain", 0, 7),
                               ("iso", "v0", 0, 0), ("iso", "v1", 1, 0), ("iso", "v2", 0, 2),
                               ("iso", "v3", 1, 2), ("iso", "v4", 0, 4), ("iso", "v5", 1, 4)]
        # read_committed (the default): no aborted record, and nothing from the open
        # transaction's first offset on (the last stable offset), not even the plain record.
        assert committed == explicit == [("iso", "v1", 1, 0), ("iso", "v2", 0, 2),
                                         ("iso", "v4", 0, 4), ("iso", "v5", 1, 4)]
        p.commit_transaction()
        assert rows(read(spark, broker, subscribe="iso", startingOffsets="earliest")) == sorted(
            committed + [("iso", "open", 0, 6), ("iso", "plain", 0, 7)])
    finally:
        plain.close()
        p.close()


# -- which topics and partitions, which offsets ----------------------------------------------


def test_subscribe_pattern_reads_only_the_matching_topics(spark, broker):
    names = {"pat-a": 2, "pat-b": 1, "pat-c": 1, "pat-a-x": 1, "xpat-b": 1}
    create(broker, *(NewTopic(t, n) for t, n in names.items()))
    p = plain_producer(broker)
    try:
        for t, n in names.items():
            for part in range(n):
                p.send(t, f"{t}/{part}".encode(), partition=part)
        p.flush()
    finally:
        p.close()
    # The regex must match the whole name (as Java's Pattern.matches in Spark's Kafka source).
    got = rows(read(spark, broker, subscribePattern="pat-[ab]", startingOffsets="earliest"))
    assert got == [("pat-a", "pat-a/0", 0, 0), ("pat-a", "pat-a/1", 1, 0),
                   ("pat-b", "pat-b/0", 0, 0)]
    got = rows(read(spark, broker, subscribe="pat-c,pat-a-x", startingOffsets="earliest"))
    assert got == [("pat-a-x", "pat-a-x/0", 0, 0), ("pat-c", "pat-c/0", 0, 0)]


def test_assign_reads_only_the_assigned_partitions(spark, broker):
    create(broker, NewTopic("asg", 3), NewTopic("asg-other", 1))
    p = plain_producer(broker)
    try:
        for part in range(3):
            for i in range(2):
                p.send("asg", f"{part}.{i}".encode(), partition=part)
        p.send("asg-other", b"other", partition=0)
        p.flush()
    finally:
        p.close()
    got = rows(read(spark, broker, assign=json.dumps({"asg": [1]}),
                    startingOffsets="earliest"))
    assert got == [("asg", "1.0", 1, 0), ("asg", "1.1", 1, 1)]
    got = rows(read(spark, broker, assign=json.dumps({"asg": [0, 2], "asg-other": [0]}),
                    startingOffsets="earliest"))
    assert got == [("asg", "0.0", 0, 0), ("asg", "0.1", 0, 1), ("asg", "2.0", 2, 0),
                   ("asg", "2.1", 2, 1), ("asg-other", "other", 0, 0)]


def test_batch_starting_and_ending_offsets_as_json(spark, broker):
    create(broker, NewTopic("range", 2))
    p = plain_producer(broker)
    try:
        for i in range(8):
            for part in range(2):
                p.send("range", f"{part}.{i}".encode(), partition=part)
        p.flush()
    finally:
        p.close()
    got = rows(read(spark, broker, subscribe="range",
                    startingOffsets='{"range":{"0":2,"1":-2}}',
                    endingOffsets='{"range":{"0":4,"1":-1}}'))
    assert got == ([("range", f"0.{i}", 0, i) for i in (2, 3)]
                   + [("range", f"1.{i}", 1, i) for i in range(8)])
    # A partition left out takes the default: earliest to start, latest to end.
    got = rows(read(spark, broker, subscribe="range", startingOffsets='{"range":{"1":5}}',
                    endingOffsets='{"range":{"0":1}}'))
    assert got == [("range", "0.0", 0, 0)] + [("range", f"1.{i}", 1, i) for i in (5, 6, 7)]

    # Over transactions: the ranges hold aborted records and markers.
    t = with_transactions(broker, "range-txn")
    t.close()
    got = rows(read(spark, broker, subscribe="range-txn",
                    startingOffsets='{"range-txn":{"0":2,"1":-2}}',
                    endingOffsets='{"range-txn":{"0":4,"1":-1}}'))
    assert got == [("range-txn", "v1", 1, 0), ("range-txn", "v2", 0, 2),
                   ("range-txn", "v5", 1, 4)]
    # Starting on an aborted record and ending on a marker.
    got = rows(read(spark, broker, subscribe="range-txn",
                    startingOffsets='{"range-txn":{"0":0,"1":2}}',
                    endingOffsets='{"range-txn":{"0":4,"1":4}}'))
    assert got == [("range-txn", "v2", 0, 2)]

    # Starting inside an aborted transaction of several batches, ending inside a committed one:
    # a0 0, marker 1, b0 b1 b2 (aborted) 2-4, marker 5, c0 c1 6-7, marker 8.
    create(broker, NewTopic("range-mid", 1))
    t = txn_producer(broker, "range-mid-w")
    try:
        for values, commit in ((["a0"], True), (["b0", "b1", "b2"], False),
                               (["c0", "c1"], True)):
            t.begin_transaction()
            for v in values:
                t.send("range-mid", v.encode(), partition=0)
                t.flush()  # a batch each
            (t.commit_transaction if commit else t.abort_transaction)()
    finally:
        t.close()

    def mid(start: int, end: int) -> list[tuple[str, int]]:
        return [(v, o) for _, v, _, o in rows(read(
            spark, broker, subscribe="range-mid",
            startingOffsets=json.dumps({"range-mid": {"0": start}}),
            endingOffsets=json.dumps({"range-mid": {"0": end}})))]

    assert mid(3, 7) == [("c0", 6)]
    assert mid(3, -1) == [("c0", 6), ("c1", 7)]
    assert mid(0, 3) == [("a0", 0)]
    assert mid(7, 8) == [("c1", 7)]
    assert mid(8, -1) == []


def test_stream_starting_offsets_latest_reads_only_later_records(spark, broker, tmp_path):
    create(broker, NewTopic("late", 2))
    p = plain_producer(broker)
    try:
        for part in range(2):
            p.send("late", b"before", partition=part)
        p.flush()
        df = (spark.readStream.format("oncelog")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", "late").option("startingOffsets", "latest").load())
        q = (df.selectExpr("CAST(value AS STRING) v", "partition", "offset").writeStream
             .format("memory").queryName("late")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            def seen():
                return sorted(tuple(r) for r in spark.sql("select * from late").collect())

            # The query has planned its start (no data to read) once it waits for data.
            wait_until(lambda: q.status["message"] == "Waiting for data to arrive",
                       what="the query to start")
            time.sleep(1.5)  # a few idle triggers: the start must stay where it was
            for part in range(2):
                p.send("late", b"after", partition=part)
            p.flush()
            wait_until(lambda: len(seen()) >= 2, what="the records produced after the start")
            time.sleep(1)
            assert seen() == [("after", 0, 1), ("after", 1, 1)]
        finally:
            q.stop()
    finally:
        p.close()


# -- failOnDataLoss ------------------------------------------------------------------------


def test_fail_on_data_loss(spark, broker, tmp_path):
    # A segment per batch, and retention keeps only the active one (checked every 200 ms).
    create(broker, NewTopic("lossy", 1, config={"segment.bytes": "100",
                                                "retention.bytes": "1"}))
    p = plain_producer(broker)
    try:
        for i in range(6):
            p.send("lossy", f"r{i}".encode(), partition=0)
            p.flush()
    finally:
        p.close()
    # Until retention is done (only the active segment, offset 5, is left): a retention pass
    # between reading the log start and the reads below would move it under the test.
    wait_until(lambda: offsets(broker, "lossy", 1)[0][0] == 5, what="retention")
    (first,), (end,) = offsets(broker, "lossy", 1)
    assert 0 < first < end == 6

    with pytest.raises(Exception, match="failOnDataLoss") as info:
        read(spark, broker, subscribe="lossy",
             startingOffsets='{"lossy":{"0":0}}').collect()
    assert f"offsets 0..{first - 1} are gone" in str(info.value)

    got = rows(read(spark, broker, subscribe="lossy", startingOffsets='{"lossy":{"0":0}}',
                    failOnDataLoss="false"))
    assert got == [("lossy", f"r{i}", 0, i) for i in range(first, end)]
    # earliest is never data loss
    got = rows(read(spark, broker, subscribe="lossy", startingOffsets="earliest"))
    assert got == [("lossy", f"r{i}", 0, i) for i in range(first, end)]

    # A stream: the query fails; with failOnDataLoss=false it reads from the earliest.
    def stream(name: str, **options: str):
        df = (spark.readStream.format("oncelog")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", "lossy").option("startingOffsets", '{"lossy":{"0":0}}')
              .options(**options).load())
        return (df.selectExpr("CAST(value AS STRING) v", "partition", "offset").writeStream
                .format("memory").queryName(name)
                .option("checkpointLocation", str(tmp_path / name)).start())

    q = stream("lossy_fail")
    try:
        with pytest.raises(Exception, match="failOnDataLoss") as info:
            q.awaitTermination(60)
            raise AssertionError("the query did not fail")
        assert f"offsets 0..{first - 1} are gone" in str(info.value)
    finally:
        q.stop()
    q = stream("lossy_skip", failOnDataLoss="false")
    try:
        def seen():
            return sorted(tuple(r) for r in spark.sql("select * from lossy_skip").collect())

        wait_until(lambda: len(seen()) >= end - first, what="the records left")
        assert q.exception() is None
        assert seen() == [(f"r{i}", 0, i) for i in range(first, end)]
    finally:
        q.stop()


# -- bad options -----------------------------------------------------------------------------


def test_bad_options_give_clear_errors(spark, broker, tmp_path):
    create(broker, NewTopic("opts", 1))

    def error(load: Callable[[], object]) -> str:
        with pytest.raises(Exception) as info:
            load()
        return str(info.value)

    bs = broker.bootstrap_servers
    assert "give exactly one of the options subscribe, subscribePattern, assign" in error(
        lambda: read(spark, broker, subscribe="opts", assign='{"opts":[0]}').collect())
    assert "give exactly one of the options subscribe, subscribePattern, assign" in error(
        lambda: read(spark, broker, startingOffsets="earliest").collect())
    assert "option kafka.bootstrap.servers is required" in error(
        lambda: spark.read.format("oncelog").option("subscribe", "opts").load().collect())
    assert "option assign: expected JSON" in error(
        lambda: read(spark, broker, assign="opts-0").collect())
    assert "option startingOffsets: expected earliest, latest or JSON" in error(
        lambda: read(spark, broker, subscribe="opts", startingOffsets="first").collect())
    assert "startingOffsets latest makes no sense for a batch query" in error(
        lambda: read(spark, broker, subscribe="opts", startingOffsets="latest").collect())
    assert "option failOnDataLoss must be true or false" in error(
        lambda: read(spark, broker, subscribe="opts", failOnDataLoss="maybe").collect())
    assert "endingOffsets: opts-0 ends at 0 (the last stable offset), not 5" in error(
        lambda: read(spark, broker, subscribe="opts",
                     endingOffsets='{"opts":{"0":5}}').collect())
    assert "opts-0: startingOffsets 3 is past endingOffsets 0" in error(
        lambda: read(spark, broker, subscribe="opts",
                     startingOffsets='{"opts":{"0":3}}').collect())

    def stream_with_ending_offsets():
        df = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs)
              .option("subscribe", "opts").option("endingOffsets", "latest").load())
        q = (df.writeStream.format("memory").queryName("ending")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            q.awaitTermination(60)
            raise AssertionError("the query ran with endingOffsets")
        finally:
            q.stop()

    assert "endingOffsets is for batch queries only" in error(stream_with_ending_offsets)


# -- maxOffsetsPerTrigger over several partitions, with transactions -------------------------


def test_stream_max_offsets_per_trigger_over_partitions_with_gaps(spark, broker, tmp_path):
    topic, parts, cap = "many", 3, 7
    create(broker, NewTopic(topic, parts))
    p = txn_producer(broker, "many-w")
    expected: dict[int, list[str]] = {i: [] for i in range(parts)}

    def produce(first: int, last: int) -> None:
        # Transactions of 1-3 records, each record its own batch, some spanning partitions;
        # every third aborted: aborted runs and markers leave gaps of several offsets.
        for n in range(first, last):
            p.begin_transaction()
            sent = []
            for j in range(1 + n % 3):
                part = (n + j * (n % 2)) % parts
                value = f"t{n}.{j}"
                p.send(topic, value.encode(), partition=part)
                p.flush()
                sent.append((part, value))
            if n % 3 == 2:
                p.abort_transaction()
            else:
                p.commit_transaction()
                for part, value in sent:
                    expected[part].append(value)

    # A memory sink, not foreachBatch: a foreachBatch callback into this process hung the
    # query for ever in full suite runs (the py4j callback server of a worker's earlier
    # SparkSession was gone); the progress reports give each micro-batch's size instead.
    name = "many_gaps"

    def got_rows() -> list[tuple[int, int, str]]:
        return [(r.partition, r.offset, r.value.decode())
                for r in spark.sql(f"select partition, offset, value from {name}").collect()]

    try:
        produce(0, 18)
        df = (spark.readStream.format("oncelog")
              .option("kafka.bootstrap.servers", broker.bootstrap_servers)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(cap)).load())
        q = (df.select("partition", "offset", "value").writeStream.format("memory")
             .queryName(name).option("checkpointLocation", str(tmp_path / "ck")).start())
        try:
            wait_until(lambda: len(got_rows()) > 0, what="the first batch")
            produce(18, 30)  # more while the query runs
            total = sum(len(v) for v in expected.values())
            wait_until(lambda: len(got_rows()) >= total, timeout=90, what=f"{total} records")
            time.sleep(1)
            progress = q.recentProgress
            rows_read = got_rows()
        finally:
            q.stop()
    finally:
        p.close()

    ends = offsets(broker, topic, parts)[1]
    assert sum(ends) > total + cap  # there were gaps, and more than one batch's worth
    for part in range(parts):
        got = sorted((o, v) for (pt, o, v) in rows_read if pt == part)
        assert [v for _, v in got] == expected[part]  # all, in order, once, no aborted one
        assert [o for o, _ in got] == sorted({o for o, _ in got})
    assert len([x for x in progress if x["numInputRows"] > 0]) >= total // cap
    assert all(x["numInputRows"] <= cap for x in progress)


def test_max_offsets_per_trigger_is_split_by_lag_and_rounding_leaves_nothing_unused():
    from oncelog.spark.source import _rate_limit

    begin = {("t", 0): 0, ("t", 1): 10, ("t", 2): 0}
    assert _rate_limit(begin, {("t", 0): 1000, ("t", 1): 1010, ("t", 2): 1000}, 500) == {
        ("t", 0): 168, ("t", 1): 176, ("t", 2): 166}
    assert _rate_limit(begin, {("t", 0): 1, ("t", 1): 1010, ("t", 2): 5}, 100) == {
        ("t", 0): 1, ("t", 1): 109, ("t", 2): 1}
    # as Spark's Kafka source: a partition with something to read gets at least one offset
    assert _rate_limit(begin, {("t", 0): 1, ("t", 1): 11, ("t", 2): 1}, 2) == {
        ("t", 0): 1, ("t", 1): 11, ("t", 2): 1}
    assert _rate_limit(begin, {("t", 0): 3, ("t", 1): 10, ("t", 2): 0}, 500) == {
        ("t", 0): 3, ("t", 1): 10, ("t", 2): 0}


def test_a_batch_read_starts_at_the_earliest_offset_by_default(spark, broker):
    create(broker, NewTopic("dflt", 1))
    with plain_producer(broker) as p:
        for i in range(3):
            p.send("dflt", f"d{i}".encode(), partition=0)
    assert rows(read(spark, broker, subscribe="dflt")) == [
        ("dflt", f"d{i}", 0, i) for i in range(3)]

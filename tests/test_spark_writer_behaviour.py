"""The ``oncelog`` sink behaves as Spark's Kafka sink does, through real Spark (local[2]): the
default save mode appends and Overwrite/Ignore are refused, the topic option wins over the
topic column, a DataFrame the sink cannot write is refused (with Spark's words) before any job
runs, a record the broker refuses fails the write with nothing committed; and the errors a new
user meets first are plain: a broker without two-phase commit, and Spark workers whose Python
cannot import oncelog."""

from __future__ import annotations

import sys
import time
import uuid
import warnings

import pytest

pytest.importorskip("pyspark")

from support.spark_session import local_spark

import oncelog.spark
from oncelog import Admin, Consumer, NewTopic, TopicPartition
from oncelog.server.embedded import EmbeddedBroker

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    with local_spark() as s:
        yield s


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true"}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("wb", 2), NewTopic("wb-column", 1),
                             NewTopic("wb-refused", 1), NewTopic("wb-register", 1),
                             NewTopic("wb-small", 1, config={"max.message.bytes": "2000"})])
        yield b


def committed_values(b, topic: str, partitions: int = 1) -> list[bytes]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=b.bootstrap_servers, isolation_level="read_committed",
                  auto_offset_reset="earliest") as c:
        c.assign(tps)
        end = c.end_offsets(tps)
        out = []
        deadline = time.monotonic() + 20
        while any(c.position(tp) < end[tp] for tp in tps) and time.monotonic() < deadline:
            out += [r.value for r in c.poll(0.3)]
    return out


def high_watermark(b, topic: str) -> int:
    with Consumer(bootstrap_servers=b.bootstrap_servers) as c:
        return sum(c.end_offsets([TopicPartition(topic, 0)]).values())


def jobs_of(spark, run) -> tuple[list[int], str]:
    """The Spark jobs ``run`` started, and its error (it is expected to raise)."""
    sc = spark.sparkContext
    group = f"g-{uuid.uuid4().hex}"
    sc.setJobGroup(group, group)
    try:
        with pytest.raises(Exception) as failed:
            run()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    jobs = list(sc.statusTracker().getJobIdsForGroup(group))
    return jobs, str(failed.value)


def test_the_default_save_mode_appends_and_the_topic_option_wins_over_the_topic_column(
        spark, broker):
    """README's example, as written: no ``mode()``. Spark's Kafka sink takes its default,
    ErrorIfExists, as Append (a Python data source alone would be refused it by Spark)."""
    df = spark.createDataFrame([(f"v{i}", "wb-column") for i in range(20)],
                               "value string, topic string")
    (df.write.format("oncelog").option("kafka.bootstrap.servers", broker.bootstrap_servers)
     .option("topic", "wb").save())
    df.write.save(format="oncelog", mode="errorifexists", topic="wb",
                  **{"kafka.bootstrap.servers": broker.bootstrap_servers})
    got = committed_values(broker, "wb", 2)
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(20) for _ in range(2))
    assert high_watermark(broker, "wb-column") == 0


@pytest.mark.parametrize("mode", ["overwrite", "ignore"])
def test_overwrite_and_ignore_are_refused_with_sparks_words(spark, broker, mode):
    df = spark.createDataFrame([("x",)], "value string")
    w = (df.write.format("oncelog").option("kafka.bootstrap.servers", broker.bootstrap_servers)
         .option("topic", "wb-refused").mode(mode))
    jobs, message = jobs_of(spark, w.save)
    assert f"Save mode {mode.capitalize()} not allowed for oncelog" in message
    assert "Allowed save modes are Append and ErrorIfExists (default)" in message
    assert jobs == []
    if mode == "overwrite":
        # Past the Python DataFrameWriter (the JVM's, as Scala and Java callers use it): the
        # data source's writer refuses it itself.
        jobs, message = jobs_of(spark, w._jwrite.mode("overwrite").save)
        assert "Save mode Overwrite not allowed for oncelog" in message
        assert jobs == []
    assert high_watermark(broker, "wb-refused") == 0


@pytest.mark.parametrize(("schema", "options", "message"), [
    ("key string", {"topic": "wb-refused"}, "Required attribute 'value' not found"),
    ("value string", {}, ("topic option required when no 'topic' attribute is present. "
                          "Use the topic option for setting a topic.")),
    ("value int", {"topic": "wb-refused"},
     "value attribute unsupported type int. value must be a(n) string or binary"),
    ("value string, key array<string>", {"topic": "wb-refused"},
     "key attribute unsupported type array<string>. key must be a(n) string or binary"),
    ("value string, topic int", {},
     "topic attribute unsupported type int. topic must be a(n) string"),
    ("value string, partition bigint", {"topic": "wb-refused"},
     "partition attribute unsupported type bigint. partition must be a(n) int"),
    ("value string, headers map<string,binary>", {"topic": "wb-refused"},
     ("headers attribute unsupported type map<string,binary>. headers must be a(n) "
      "array<struct<key:string,value:binary>>")),
])
def test_a_dataframe_the_sink_cannot_write_is_refused_before_any_job_runs(
        spark, broker, schema, options, message):
    row = {"string": "1", "int": 1, "bigint": 1, "array<string>": ["1"],
           "map<string,binary>": {"k": b"v"}}
    df = spark.createDataFrame([tuple(row[c.split(" ", 1)[1]] for c in schema.split(", "))],
                               schema)
    w = df.write.format("oncelog").option("kafka.bootstrap.servers", broker.bootstrap_servers)
    jobs, got = jobs_of(spark, w.options(**options).save)
    assert message in got
    assert jobs == []  # no task ran, so no transaction was opened
    with Admin(bootstrap_servers=broker.bootstrap_servers) as a:
        assert a.list_transactions(states=["Ongoing", "PrepareCommit", "PrepareAbort"]) == []
    assert high_watermark(broker, "wb-refused") == 0


def test_with_the_topic_option_the_topic_column_is_not_read(spark, broker):
    """Spark's rule: the option replaces the column, whatever its type."""
    df = spark.createDataFrame([("t", 7)], "value string, topic int")
    (df.write.format("oncelog").option("kafka.bootstrap.servers", broker.bootstrap_servers)
     .option("topic", "wb-column").save())
    assert committed_values(broker, "wb-column") == [b"t"]


def test_a_record_the_broker_refuses_as_too_large_fails_the_write_and_commits_nothing(
        spark, broker):
    """wb-small takes batches of 2000 bytes at most: the task with the 5000-byte row fails (every
    attempt), so the write fails, and the other task's rows are not committed either."""
    rows = [("x" * 5000 if i == 7 else f"v{i}",) for i in range(20)]
    df = spark.createDataFrame(rows, "value string").repartition(2)
    with pytest.raises(Exception, match="(?i)too large|max.message.bytes"):
        (df.write.format("oncelog").option("kafka.bootstrap.servers", broker.bootstrap_servers)
         .option("topic", "wb-small").save())
    assert committed_values(broker, "wb-small") == []
    with Admin(bootstrap_servers=broker.bootstrap_servers) as a:
        assert a.list_transactions(states=["Ongoing", "PrepareCommit", "PrepareAbort"]) == []


def test_a_broker_without_two_phase_commit_fails_the_write_at_once_naming_the_setting(spark):
    with EmbeddedBroker() as plain:  # transaction.two.phase.commit.enable=false, the default
        with Admin(bootstrap_servers=plain.bootstrap_servers) as a:
            a.create_topics([NewTopic("t", 1)])
        df = spark.createDataFrame([("x",)], "value string")
        w = (df.write.format("oncelog").option("kafka.bootstrap.servers",
                                                 plain.bootstrap_servers).option("topic", "t"))
        started = time.monotonic()
        jobs, message = jobs_of(spark, w.save)
        assert "transaction.two.phase.commit.enable=true" in message
        assert jobs == []  # checked on the driver, before any task
        assert time.monotonic() - started < 30
        assert high_watermark(plain, "t") == 0


def test_register_runs_the_data_source_under_the_drivers_python_when_the_workers_cannot(
        spark, broker, tmp_path):
    """The workers' Python (PYSPARK_PYTHON when the SparkContext was made) here cannot import
    oncelog: register() says so, names PYSPARK_PYTHON, and the data source works anyway (its
    Python runs under this driver's). Where it can, register() says nothing."""
    no_site = tmp_path / "python-without-oncelog"
    # This interpreter without site-packages (-S) or PYTHON* variables (-E): no oncelog there.
    no_site.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S -E "$@"\n')
    no_site.chmod(0o755)
    sc = spark.sparkContext
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        oncelog.spark.register(spark)  # the workers' Python is this one: nothing to say
    sc.pythonExec = str(no_site)
    try:
        with pytest.warns(oncelog.spark.WorkerPythonWarning,
                          match=f"cannot import oncelog.*PYSPARK_PYTHON={sys.executable}"):
            oncelog.spark.register(spark)
        assert sc.pythonExec == str(no_site)  # left as it was, for the rest of the job
        df = spark.range(1).selectExpr("'w' AS value")  # no Python of its own to run
        (df.write.format("oncelog").option("kafka.bootstrap.servers", broker.bootstrap_servers)
         .option("topic", "wb-register").save())
        read = (spark.read.format("oncelog")
                .option("kafka.bootstrap.servers", broker.bootstrap_servers)
                .option("subscribe", "wb-register").load())
        assert [r.value for r in read.select("value").collect()] == [b"w"]
    finally:
        sc.pythonExec = sys.executable
        oncelog.spark.register(spark)


def test_a_stream_the_sink_cannot_write_fails_before_its_first_micro_batch(spark, broker,
                                                                           tmp_path):
    """Spark makes the stream's writer when the query starts: the query fails there."""
    src = (spark.readStream.format("rate").option("rowsPerSecond", "5").load()
           .selectExpr("CAST(value AS INT) AS value"))
    q = (src.writeStream.format("oncelog")
         .option("kafka.bootstrap.servers", broker.bootstrap_servers)
         .option("topic", "wb-refused").option("checkpointLocation", str(tmp_path / "cp"))
         .start())
    try:
        with pytest.raises(Exception, match="value attribute unsupported type int. value must "
                                            r"be a\(n\) string or binary"):
            q.awaitTermination(60)
    finally:
        q.stop()
    assert q.recentProgress == []  # not one micro-batch
    assert high_watermark(broker, "wb-refused") == 0

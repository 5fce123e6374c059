"""The Spark connector as a Kafka + Spark user sets it up and as operators see it, through real
Spark (local[2]):

- ``kafka.sasl.jaas.config`` (PLAIN and SCRAM login modules) with ``kafka.sasl.mechanism`` and
  ``kafka.security.protocol``, as Spark's Kafka connector passes them to Kafka's client: a
  write and a read against a SASL broker; a wrong password in it is refused;
- the sink's options checked on the driver (a typo, ``kafka.acks=1``) before any job runs;
- the sink's bookkeeping out of operators' views: ``__oncelog_spark_batches`` internal
  (Metadata, ``oncelog topics list --exclude-internal``), its marker groups without (negative) lag in ``oncelog
  groups describe``, the console's Groups page and the lag metric; and, with short
  ``transactional.id.expiration.ms`` and ``offsets.retention.minutes``, the per-write
  transactional ids and ``-aborted-`` groups a finished write leaves expire."""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid

import pytest

pytest.importorskip("pyspark")

from support.cli import oncelog
from support.security import USERS, creds, sasl_config
from support.spark_session import local_spark
from support.waiting import wait_until

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.server.embedded import EmbeddedBroker
from oncelog.spark_markers import MARKER_TOPIC

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture(scope="module")
def spark():
    with local_spark() as s:
        yield s


def jaas(module: str, user: str, password: str) -> str:
    return (f"org.apache.kafka.common.security.{module} required "
            f'username="{user}" password="{password}";')


PLAIN = "plain.PlainLoginModule"
SCRAM = "scram.ScramLoginModule"


def test_sasl_jaas_config_writes_and_reads_as_with_sparks_kafka_connector(spark, tmp_path):
    with EmbeddedBroker(config=sasl_config(tmp_path)) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers, **creds("admin")) as a:
            a.create_topics([NewTopic("secure", 2)])
        login = {"kafka.bootstrap.servers": b.bootstrap_servers,
                 "kafka.security.protocol": "SASL_PLAINTEXT"}
        df = spark.createDataFrame([(f"v{i}",) for i in range(30)], "value string")
        (df.write.format("oncelog").options(**login).option("topic", "secure")
         .option("kafka.sasl.mechanism", "PLAIN")
         .option("kafka.sasl.jaas.config", jaas(PLAIN, "admin", USERS["admin"])).save())

        def read(password: str):
            return (spark.read.format("oncelog").options(**login).option("subscribe", "secure")
                    .option("kafka.sasl.mechanism", "SCRAM-SHA-256")
                    .option("kafka.sasl.jaas.config", jaas(SCRAM, "admin", password)).load())

        got = sorted(r.value.decode() for r in read(USERS["admin"]).select("value").collect())
        assert got == sorted(f"v{i}" for i in range(30))
        # The credentials are the jaas config's: a wrong password fails the read.
        with pytest.raises(Exception, match="Authentication failed"):
            read("not-the-password").collect()


def test_the_sinks_options_are_refused_before_any_job(spark):
    """Spark's Kafka sink ignores an option it does not know; a typo in transactionalIdPrefix
    would silently name the transactions from the checkpoint instead, and kafka.acks=1 failed
    in every task with "transactional.id conflicts". Both are refused on the driver."""
    sc = spark.sparkContext
    df = spark.createDataFrame([("v",)], "value string")
    for option, value, message in [
            ("transactionalIdPrefx", "p", ("unknown option 'transactionalidprefx' for the "
                                           "oncelog sink (did you mean transactionalIdPrefix?)")),
            ("kafka.acks", "1", "option kafka.acks=1 is not supported by the oncelog sink")]:
        group = f"g-{uuid.uuid4().hex}"
        sc.setJobGroup(group, group)
        try:
            with pytest.raises(Exception) as failed:
                (df.write.format("oncelog").option("kafka.bootstrap.servers", "127.0.0.1:9")
                 .option("topic", "t").option(option, value).save())
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)
        assert message in str(failed.value)
        assert list(sc.statusTracker().getJobIdsForGroup(group)) == []


# Short, but not shorter than a task's time between its InitProducerId and its first write on a
# busy machine: an id that expires in between is refused (InvalidProducerIdMapping), as in Kafka.
EXPIRY = {"transactional.id.expiration.ms": "20000",
          "transaction.remove.expired.transaction.cleanup.interval.ms": "500",
          "offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000"}


@pytest.fixture
def bookkeeping_broker():
    with EmbeddedBroker(config={"transaction.two.phase.commit.enable": "true",
                                "console.port": "0", "metrics.port": "0",
                                "offsets.topic.num.partitions": "2",
                                "transaction.state.log.num.partitions": "2", **EXPIRY}) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("bk-in", 2), NewTopic("bk-out", 2), NewTopic("bk-one", 1)])
        with Producer(bootstrap_servers=b.bootstrap_servers) as p:
            for i in range(40):
                p.send("bk-in", value=f"r{i}", partition=i % 2)
        yield b


def lag_values(text: str) -> list[tuple[str, str, int]]:
    return [(m.group(1), m.group(2), int(m.group(3))) for m in re.finditer(
        r'^oncelog_consumer_group_lag\{group="([^"]*)",topic="([^"]*)",partition="\d+"\} '
        r"(-?\d+)", text, re.MULTILINE)]


def test_the_sinks_bookkeeping_is_internal_has_no_lag_and_expires(spark, bookkeeping_broker,
                                                                  tmp_path):
    b = bookkeeping_broker
    bs = b.bootstrap_servers
    # A stream through the sink in 4 micro-batches: its markers are batch ids 1..4.
    q = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs)
         .option("subscribe", "bk-in").option("startingOffsets", "earliest")
         .option("maxOffsetsPerTrigger", "10").load().select("value")
         .writeStream.format("oncelog").option("kafka.bootstrap.servers", bs)
         .option("topic", "bk-out").option("checkpointLocation", str(tmp_path / "cp"))
         .trigger(availableNow=True).start())
    q.awaitTermination(300)
    assert q.exception() is None
    # A batch write (transactional ids of its own), and one that fails (an -aborted- group).
    df = spark.createDataFrame([(f"w{i}",) for i in range(10)], "value string")
    df.write.format("oncelog").option("kafka.bootstrap.servers", bs).option(
        "topic", "bk-out").save()
    bad = spark.createDataFrame([(f"x{i}", 7 if i == 3 else 0) for i in range(10)],
                                "value string, partition int")
    with pytest.raises(Exception, match="partition 7"):
        bad.write.format("oncelog").option("kafka.bootstrap.servers", bs).option(
            "topic", "bk-one").save()

    with Admin(bootstrap_servers=bs) as a:
        groups = [g.group_id for g in a.list_consumer_groups()]
        markers = [g for g in groups if "-batches-" in g]
        aborted = [g for g in groups if "-aborted-" in g]
        assert markers and aborted, groups
        writes = [t.transactional_id for t in a.list_transactions()
                  if t.transactional_id.startswith("oncelog-spark-write-")
                  and t.transactional_id != "oncelog-spark-write-check"]
        assert writes
        # Internal in Metadata, as __consumer_offsets; left out of a plain listing.
        assert a.describe_topics([MARKER_TOPIC])[MARKER_TOPIC].internal
        assert MARKER_TOPIC not in a.list_topics()
        assert MARKER_TOPIC in a.list_topics(include_internal=True)
        marker_offsets = a.list_consumer_group_offsets(markers[0])
        assert max(o for tp, o in marker_offsets.items() if tp.topic == MARKER_TOPIC) >= 2

    # as kafka-topics --list: internal topics are listed, and left out by --exclude-internal
    listed = oncelog("topics", "list", "--bootstrap-server", bs).stdout.split()
    assert "bk-in" in listed and MARKER_TOPIC in listed and "__consumer_offsets" in listed
    listed = oncelog("topics", "list", "--exclude-internal", "--bootstrap-server", bs).stdout.split()
    assert "bk-in" in listed and MARKER_TOPIC not in listed

    described = json.loads(oncelog("groups", "describe", "--bootstrap-server", bs,
                                   "--all-groups", "--output", "json").stdout)
    marker_rows = [r for r in described if r["topic"] == MARKER_TOPIC]
    assert marker_rows and all(r["lag"] is None for r in marker_rows), marker_rows
    assert all(r["lag"] is None or r["lag"] >= 0 for r in described), described

    console = f"http://127.0.0.1:{b.server.console.port}/groups"
    with urllib.request.urlopen(console, timeout=10) as r:
        body = r.read().decode()
    assert f'data-group="{markers[0]}"' in body
    assert not re.search(r'data-lag="-\d', body)
    with urllib.request.urlopen(f"http://127.0.0.1:{b.server.metrics_port}/metrics",
                                timeout=10) as r:
        lags = lag_values(r.read().decode())
    assert all(lag >= 0 for _g, _t, lag in lags), lags
    assert not [x for x in lags if x[1] == MARKER_TOPIC], lags

    # What the finished writes left expires: the transactional ids after
    # transactional.id.expiration.ms, the groups (offsets alone) after offsets.retention.minutes.
    with Admin(bootstrap_servers=bs) as a:
        def left() -> list[str]:
            ids = {t.transactional_id for t in a.list_transactions()}
            names = {g.group_id for g in a.list_consumer_groups()}
            return sorted((ids & set(writes)) | (names & set(aborted + markers)))

        wait_until(lambda: not left(), 150, "the sink's ids and groups expired")
    # The rows are all there, once (read_committed).
    tps = [TopicPartition("bk-out", p) for p in range(2)]
    with Consumer(bootstrap_servers=bs, isolation_level="read_committed",
                  auto_offset_reset="earliest") as c:
        c.assign(tps)
        end = c.end_offsets(tps)
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while any(c.position(tp) < end[tp] for tp in tps) and time.monotonic() < deadline:
            values += [r.value for r in c.poll(0.3)]
    assert sorted(values) == sorted([f"r{i}".encode() for i in range(40)]
                                    + [f"w{i}".encode() for i in range(10)])

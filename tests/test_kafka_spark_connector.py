"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10) against oncelog, with
the jars ``scripts/kafka.sh spark-jars`` prints as ``spark.jars`` of the pinned PySpark: a batch
write, read back by oncelog's consumer; a batch read of what oncelog's producer wrote (keys,
headers, partitions, offsets), committed and aborted transactions seen as read_committed."""

from __future__ import annotations

import pytest
from support.apache_kafka import require_kafka
from support.interop import unique_topic
from support.spark_session import local_spark

pytest.importorskip("pyspark")

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.harness.apache_kafka import kafka_sh
from oncelog.server.embedded import EmbeddedBroker

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture(scope="module")
def spark():
    require_kafka()
    out = kafka_sh("spark-jars")
    assert out.returncode == 0, out.stderr.decode()
    jars = out.stdout.decode().strip()
    assert "spark-sql-kafka-0-10" in jars and "spark-token-provider-kafka" in jars
    with local_spark(**{"spark.jars": jars}) as s:
        yield s


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker() as b:
        yield b.bootstrap_servers


def read_all(bs: str, topic: str, partitions: int):
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=bs, auto_offset_reset="earliest") as c:
        c.assign(tps)
        end = c.end_offsets(tps)
        out = []
        while any(c.position(tp) < end[tp] for tp in tps):
            out += c.poll(1.0)
    return out


def test_a_batch_write_with_sparks_kafka_connector_lands_in_oncelog(spark, broker):
    topic = unique_topic("spark-kafka-out")
    with Admin(bootstrap_servers=broker) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    rows = [(f"k{i}", f"v{i}", i % 2, [("n", str(i).encode())]) for i in range(40)]
    df = spark.createDataFrame(rows, "key string, value string, partition int, "
                               "headers array<struct<key: string, value: binary>>")
    (df.write.format("kafka").option("kafka.bootstrap.servers", broker)
     .option("topic", topic).save())
    got = read_all(broker, topic, 2)
    assert sorted((r.key, r.value, r.partition, [(k, v) for k, v in r.headers]) for r in got) \
        == sorted((k.encode(), v.encode(), p, h) for k, v, p, h in rows)


def test_a_batch_read_with_sparks_kafka_connector_of_what_oncelog_holds(spark, broker):
    topic = unique_topic("spark-kafka-in")
    with Admin(bootstrap_servers=broker) as admin:
        admin.create_topics([NewTopic(topic, 2)])
    with Producer(bootstrap_servers=broker, transactional_id=f"{topic}-tx") as p:
        p.init_transactions()
        for end in ("commit", "abort", "commit"):
            p.begin_transaction()
            for i in range(5):
                p.send(topic, f"{end}{i}".encode(), key=f"k{i}".encode(), partition=i % 2,
                       headers=[("end", end.encode())])
            p.commit_transaction() if end == "commit" else p.abort_transaction()

    def read(isolation: str):
        df = (spark.read.format("kafka").option("kafka.bootstrap.servers", broker)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("endingOffsets", "latest").option("includeHeaders", "true")
              .option("kafka.isolation.level", isolation).load())
        assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp",
                              "timestampType", "headers"]
        return sorted((bytes(r.key), bytes(r.value), r.topic, r.partition, r.offset,
                       [(h.key, bytes(h.value)) for h in r.headers]) for r in df.collect())

    committed = read("read_committed")
    # two committed transactions of five records each; the aborted one is skipped
    assert sorted(r[1] for r in committed) == sorted(f"commit{i}".encode()
                                                     for i in range(5) for _ in (0, 1))
    assert {r[2] for r in committed} == {topic} and {r[3] for r in committed} == {0, 1}
    assert all(r[5] == [("end", b"commit")] for r in committed)
    # the offsets are oncelog's: a record per offset, markers between the transactions
    ours = {(r.partition, r.offset, r.value) for r in read_all(broker, topic, 2)
            if r.value.startswith(b"commit")}
    assert {(r[3], r[4], r[1]) for r in committed} == ours
    uncommitted = read("read_uncommitted")
    assert sorted(r[1] for r in uncommitted) == sorted(
        f"{end}{i}".encode() for end in ("commit", "abort", "commit") for i in range(5))

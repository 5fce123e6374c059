"""The Spark connector's Arrow data path without Spark, against a real broker: a sink task's
``RecordBatch`` routed by the topic option or column and by the partition column or the key
(some rows naming their partition, the others not), headers kept, a null topic refused with
Spark's words; and the reader's batches of Spark's Kafka rows cut at the range's end, with
the Arrow schema Spark checks."""

from __future__ import annotations

import time

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.server.embedded import EmbeddedBroker
from oncelog.spark.arrow_io import (
    RowError,
    arrow_schema,
    send_record_batch,
    spark_batch,
)
from oncelog.spark.options import parse
from oncelog.spark.source import TopicPartitionRange, read_range

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker() as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("a", 3), NewTopic("b", 2), NewTopic("opt", 1),
                             NewTopic("src", 1)])
        yield b


def read_all(b, topic: str, partitions: int, expect: int):
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap_servers=b.bootstrap_servers, auto_offset_reset="earliest") as c:
        c.assign(tps)
        out = []
        deadline = time.monotonic() + 20
        while len(out) < expect and time.monotonic() < deadline:
            out += c.poll(0.2)
    return out


def test_a_record_batch_goes_by_topic_column_partition_column_and_key(broker):
    n = 40
    topics = ["a" if i % 2 else "b" for i in range(n)]
    # in topic a, every third row names its partition, the others go by their key
    partitions = [(i % 3 if topics[i] == "a" else 1) if i % 3 == 0 else None for i in range(n)]
    batch = pa.RecordBatch.from_arrays([
        pa.array([f"k{i}".encode() for i in range(n)], pa.binary()),
        pa.array([f"v{i}" for i in range(n)], pa.string()),
        pa.array(topics, pa.string()),
        pa.array(partitions, pa.int32()),
        pa.array([[{"key": "i", "value": str(i).encode()}] if i % 5 else None
                  for i in range(n)], HEADERS),
    ], names=["key", "value", "topic", "partition", "headers"])
    with Producer(bootstrap_servers=broker.bootstrap_servers) as p:
        sent = send_record_batch(p, batch, None)
        p.flush(20)
        assert all(f.exception() is None for _, _, f in sent)
        expected_a = {}
        for i in range(n):  # where send() puts a keyed row without a partition
            if topics[i] == "a" and partitions[i] is None:
                expected_a[i] = p.send("a", b"probe", key=f"k{i}".encode()).result(10).partition
    got = {int(r.value[1:]): r for r in read_all(broker, "a", 3, n // 2 + len(expected_a))
           if r.value != b"probe"}
    got_b = {int(r.value[1:]): r for r in read_all(broker, "b", 2, n // 2)}
    assert sorted(got) == [i for i in range(n) if topics[i] == "a"]
    assert sorted(got_b) == [i for i in range(n) if topics[i] == "b"]
    for i, r in {**got, **got_b}.items():
        want = partitions[i] if partitions[i] is not None else expected_a.get(i, r.partition)
        assert r.partition == want, i
        assert r.key == f"k{i}".encode()
        assert r.headers == ([("i", str(i).encode())] if i % 5 else [])


def test_the_topic_option_wins_and_a_null_topic_is_refused(broker):
    batch = pa.RecordBatch.from_arrays([pa.array([b"x", b"y"]), pa.array(["b", None])],
                                       names=["value", "topic"])
    with Producer(bootstrap_servers=broker.bootstrap_servers) as p:
        with pytest.raises(RowError, match="null topic present in the data"):
            send_record_batch(p, batch, None)
        sent = send_record_batch(p, batch, "opt")
        p.flush(20)
        assert [(t, f.exception()) for t, _, f in sent] == [("opt", None)]
    assert sorted(r.value for r in read_all(broker, "opt", 1, 2)) == [b"x", b"y"]


def test_the_reader_yields_sparks_kafka_rows_cut_at_the_end(broker):
    with Producer(bootstrap_servers=broker.bootstrap_servers) as p:
        p.send_batch("src", [b"v%d" % i for i in range(100)],
                     [None if i % 7 == 0 else b"k%d" % i for i in range(100)], partition=0,
                     headers=[[("h", b"%d" % i)] for i in range(100)]).result(20)
    opts = parse({"kafka.bootstrap.servers": broker.bootstrap_servers, "subscribe": "src",
                  "includeHeaders": "true"})
    batches = list(read_range(opts, TopicPartitionRange("src", 0, 10, 60)))
    assert all(b.schema.equals(arrow_schema(True)) for b in batches)
    rows = pa.Table.from_batches(batches).to_pylist()
    assert [r["offset"] for r in rows] == list(range(10, 60))
    assert [r["value"] for r in rows] == [b"v%d" % i for i in range(10, 60)]
    assert [r["key"] for r in rows] == [None if i % 7 == 0 else b"k%d" % i
                                        for i in range(10, 60)]
    assert {(r["topic"], r["partition"], r["timestampType"]) for r in rows} == {("src", 0, 0)}
    assert [r["headers"] for r in rows] == [[{"key": "h", "value": b"%d" % i}]
                                            for i in range(10, 60)]
    assert all(r["timestamp"].tzinfo is not None for r in rows)


def test_spark_batch_cuts_at_the_end_and_drops_a_batch_wholly_past_it():
    columns = {"offset": pa.array([5, 6, 7], pa.int64()),
               "timestamp": pa.array([1000, 2000, 3000], pa.int64()),
               "timestamp_type": pa.array([1, 1, 1], pa.int32()),
               "key": pa.array([b"a", None, b"c"]), "value": pa.array([b"1", b"2", b"3"]),
               "headers": pa.array([None, None, None], HEADERS)}
    schema = arrow_schema(False)
    cut = spark_batch(schema, "t", 4, columns, 7)
    assert cut.num_rows == 2 and cut.schema.equals(schema)
    assert cut.column("timestamp").to_pylist()[1].timestamp() == 2.0
    assert cut.column("timestampType").to_pylist() == [1, 1]
    assert spark_batch(schema, "t", 4, columns, 5) is None

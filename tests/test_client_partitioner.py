"""Keyed records land where the Java client puts them; unkeyed records stick to a partition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from oncelog import Admin, NewTopic, Producer
from oncelog.client.producer.partitioner import StickyPartitioner, murmur2, partition_for_key

# From Apache Kafka's UtilsTest.testMurmur2 (the Java client's own expectations).
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data, expected", JAVA_MURMUR2.items())
def test_murmur2_matches_the_java_client(data, expected):
    assert murmur2(data) == expected


@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python(data):
    # kafka-python returns the same 32 bits unsigned
    assert murmur2(data) & 0xFFFFFFFF == kafka_python_murmur2(data)


@given(st.binary(min_size=1, max_size=32), st.integers(1, 1000))
def test_partition_for_key_is_javas_formula(key, n):
    assert partition_for_key(key, n) == (kafka_python_murmur2(key) & 0x7FFFFFFF) % n


def test_sticky_partitioner_moves_on_only_when_the_batch_is_full():
    sticky = StickyPartitioner()
    partitions = [0, 1, 2, 3]
    first = sticky.partition("t", partitions)
    assert all(sticky.partition("t", partitions) == first for _ in range(20))
    sticky.batch_full("t", first, partitions)
    second = sticky.partition("t", partitions)
    assert second != first
    sticky.batch_full("t", first, partitions)  # stale news from another thread: ignored
    assert sticky.partition("t", partitions) == second


def test_keyed_records_go_to_the_java_partition(embedded_broker):
    servers = embedded_broker.bootstrap_servers
    with Admin(bootstrap_servers=servers) as admin:
        admin.create_topics([NewTopic("keyed", num_partitions=5)])
    keys = [f"user-{i}".encode() for i in range(60)]
    with Producer(bootstrap_servers=servers) as producer:
        futures = [producer.send("keyed", b"v", key=k) for k in keys]
        results = [f.result(10) for f in futures]
    for key, md in zip(keys, results):
        assert md.partition == (kafka_python_murmur2(key) & 0x7FFFFFFF) % 5
    assert len({md.partition for md in results}) > 1


def test_unkeyed_records_fill_one_partitions_batch_before_moving(embedded_broker):
    servers = embedded_broker.bootstrap_servers
    with Admin(bootstrap_servers=servers) as admin:
        admin.create_topics([NewTopic("unkeyed", num_partitions=4)])
    # linger long enough that nothing leaves before the batches are full
    with Producer(bootstrap_servers=servers, batch_size=1000, linger_ms=60000) as producer:
        futures = [producer.send("unkeyed", b"x" * 100) for _ in range(40)]
        producer.flush(10)
        partitions = [f.result().partition for f in futures]
    runs = [p for i, p in enumerate(partitions) if i == 0 or partitions[i - 1] != p]
    assert len(runs) > 1  # it moved on
    assert len(runs) < 10  # but in runs of several records (a batch), not one by one

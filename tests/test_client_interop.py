"""Our client and librdkafka (confluent_kafka) read each other's records, every codec.

Against librdkafka's mock cluster: librdkafka writes the batches in one direction and decodes
ours in the other, so neither side of our codec is checked only against itself.
"""

from __future__ import annotations

import time

import confluent_kafka
import pytest

from oncelog import Consumer, Producer, TopicPartition

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


@pytest.mark.parametrize("codec", CODECS)
def test_our_consumer_reads_what_librdkafka_produced(mock_cluster, codec):
    topic = f"from-librdkafka-{codec}"
    theirs = confluent_kafka.Producer({"bootstrap.servers": mock_cluster.bootstrap_servers,
                                       "compression.type": codec, "linger.ms": 50})
    sent = [(f"k{i}".encode(), f"value {i} ".encode() * 20) for i in range(100)]
    for key, value in sent:
        theirs.produce(topic, value, key=key, partition=0, headers=[("h", key)])
    assert theirs.flush(10) == 0
    with Consumer(bootstrap_servers=mock_cluster.bootstrap_servers,
                  auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        records = []
        deadline = time.monotonic() + 10
        while len(records) < 100 and time.monotonic() < deadline:
            records += consumer.poll(timeout=1)
    assert [(r.key, r.value, r.headers) for r in records] == \
        [(k, v, [("h", k)]) for k, v in sent]


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_reads_what_our_producer_produced(mock_cluster, codec):
    topic = f"to-librdkafka-{codec}"
    sent = [(f"k{i}".encode(), f"value {i} ".encode() * 20) for i in range(100)]
    with Producer(bootstrap_servers=mock_cluster.bootstrap_servers,
                  compression_type=codec) as producer:
        for key, value in sent:
            producer.send(topic, value, key=key, partition=0, headers=[("h", key)])
        producer.flush(10)
    theirs = confluent_kafka.Consumer({"bootstrap.servers": mock_cluster.bootstrap_servers,
                                       "group.id": "interop", "enable.auto.commit": False,
                                       "check.crcs": True})
    try:
        theirs.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 100 and time.monotonic() < deadline:
            msg = theirs.poll(1)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.key(), msg.value(), msg.headers()))
    finally:
        theirs.close()
    assert got == [(k, v, [("h", k)]) for k, v in sent]

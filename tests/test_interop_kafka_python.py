"""kafka-python against a real broker process: admin, idempotent produce, group-less consume,
and records produced by kafka-python read by the other clients."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.errors import InvalidTopicError, TopicAlreadyExistsError
from support.interop import (
    CODECS,
    CONSUMERS,
    KCAT,
    check_consumed,
    dataset,
    kafka_python_consume,
    kafka_python_produce,
    unique_topic,
)

from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

PARTITIONS = 3
OPTIONAL_CODECS = ("snappy", "lz4", "zstd")  # need python-snappy, lz4, zstandard


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("kafka-python") / "data") as b:
        yield b
        assert b.running, b.log_tail()


@pytest.fixture(scope="module")
def admin(broker):
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    yield client
    client.close()


def create_topic(admin, topic, partitions=PARTITIONS, configs=None):
    admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=configs or {})])


def test_admin_creates_describes_and_deletes_topics(admin):
    topic = unique_topic("kp-admin")
    create_topic(admin, topic, 2, {"retention.ms": "3600000"})
    assert topic in admin.list_topics()
    (desc,) = admin.describe_topics([topic])
    assert desc["error_code"] == 0
    assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1]
    assert {p["leader_id"] for p in desc["partitions"]} == {1}

    with pytest.raises(TopicAlreadyExistsError):
        create_topic(admin, topic, 1)
    with pytest.raises(InvalidTopicError):
        create_topic(admin, "no/slashes", 1)

    result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    retention = result["topic"][topic]["retention.ms"]
    assert (retention["value"], retention["config_source"]) == ("3600000",
                                                                "DYNAMIC_TOPIC_CONFIG")

    admin.delete_topics([topic])
    assert topic not in admin.list_topics()


@pytest.mark.parametrize("codec", ["none", "gzip", *OPTIONAL_CODECS])
def test_idempotent_produce_then_consume_exact_records_and_offsets(broker, admin, codec):
    if codec not in CODECS["kafka-python"]:
        pytest.skip(f"kafka-python needs an extra package for {codec} "
                    "(python-snappy / lz4 / zstandard)")
    topic = unique_topic(f"kp-{codec}")
    create_topic(admin, topic)
    # kafka-python refuses header values of None; everything else of the dataset goes.
    produced = kafka_python_produce(broker.bootstrap_servers, topic,
                                    dataset(codec, 300, null_header_values=False),
                                    PARTITIONS, codec)
    consumed = kafka_python_consume(broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS)


def test_offsets_for_times_and_end_offsets(broker, admin):
    topic = unique_topic("kp-offsets")
    create_topic(admin, topic, 1)
    produced = kafka_python_produce(broker.bootstrap_servers, topic,
                                    dataset("ts", 50, null_header_values=False), 1, "gzip")
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 50}
        r = produced[17]
        found = consumer.offsets_for_times({tp: r.timestamp})[tp]
        assert (found.offset, found.timestamp) == (r.offset, r.timestamp)
        assert consumer.offsets_for_times({tp: produced[-1].timestamp + 1})[tp] is None
    finally:
        consumer.close()


@pytest.mark.parametrize("consumer", ["confluent", "aiokafka", "kcat"])
def test_records_produced_by_kafka_python_decode_in_other_clients(broker, admin, consumer):
    if consumer == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (Debian package kcat)")
    topic = unique_topic(f"from-kp-to-{consumer}")
    create_topic(admin, topic)
    produced = []
    codecs = [c for c in CODECS["kafka-python"] if c in CODECS[consumer]]
    for n, codec in enumerate(codecs):
        produced += kafka_python_produce(
            broker.bootstrap_servers, topic,
            dataset(f"kp-{codec}", 90, start=90 * n, text_only=consumer == "kcat",
                    null_header_values=False),
            PARTITIONS, codec)
    consumed = CONSUMERS[consumer](broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS)

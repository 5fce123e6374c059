"""confluent-kafka (librdkafka) against a real broker process: admin, idempotent produce with
every codec, group-less consume, and the records of every other client."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from support.interop import (
    CODECS,
    CONSUMERS,
    DEADLINE_S,
    KCAT,
    check_consumed,
    confluent_consume,
    confluent_create_topic,
    confluent_produce,
    dataset,
    unique_topic,
)

from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

PARTITIONS = 3


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("confluent") / "data") as b:
        yield b
        assert b.running, b.log_tail()


def test_admin_creates_describes_and_deletes_topics(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    topic = unique_topic("admin")
    futures = admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1,
                                            config={"retention.ms": "3600000"})])
    futures[topic].result(timeout=DEADLINE_S)

    md = admin.list_topics(timeout=DEADLINE_S)
    assert sorted(md.topics[topic].partitions) == [0, 1, 2, 3]
    assert md.topics[topic].partitions[0].leader == 1

    # Creating it again, or with a bad name, fails with Kafka's errors.
    again = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    with pytest.raises(KafkaException) as exc:
        again[topic].result(timeout=DEADLINE_S)
    assert exc.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    bad = admin.create_topics([NewTopic("no/slashes", num_partitions=1, replication_factor=1)])
    with pytest.raises(KafkaException) as exc:
        bad["no/slashes"].result(timeout=DEADLINE_S)
    assert exc.value.args[0].code() == KafkaError.TOPIC_EXCEPTION

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=DEADLINE_S)
    assert configs["retention.ms"].value == "3600000"
    assert not configs["retention.ms"].is_default
    assert configs["segment.bytes"].is_default

    admin.delete_topics([topic])[topic].result(timeout=DEADLINE_S)
    assert topic not in admin.list_topics(timeout=DEADLINE_S).topics


@pytest.mark.parametrize("codec", CODECS["confluent"])
def test_idempotent_produce_then_consume_exact_records_and_offsets(broker, codec):
    topic = unique_topic(f"confluent-{codec}")
    confluent_create_topic(broker.bootstrap_servers, topic, PARTITIONS)
    produced = confluent_produce(broker.bootstrap_servers, topic, dataset(codec, 300),
                                 PARTITIONS, codec)
    consumed = confluent_consume(broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS)


def test_mixed_codecs_in_one_partition_read_back_in_order(broker):
    topic = unique_topic("confluent-mixed")
    confluent_create_topic(broker.bootstrap_servers, topic, 1)
    produced = []
    for n, codec in enumerate(CODECS["confluent"]):
        produced += confluent_produce(broker.bootstrap_servers, topic,
                                      dataset(codec, 60, start=60 * n), 1, codec)
    assert [r.offset for r in produced] == list(range(len(produced)))
    check_consumed(produced, confluent_consume(broker.bootstrap_servers, topic, 1), partitions=1)


def test_watermarks_and_offsets_for_times(broker):
    topic = unique_topic("confluent-offsets")
    confluent_create_topic(broker.bootstrap_servers, topic, 1)
    produced = confluent_produce(broker.bootstrap_servers, topic, dataset("ts", 100), 1, "lz4")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused",
                         "enable.auto.commit": False})
    try:
        assert consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 100)
        for r in (produced[0], produced[41], produced[99]):
            found = consumer.offsets_for_times([TopicPartition(topic, 0, r.timestamp)],
                                               timeout=10)
            assert found[0].offset == r.offset
        past = consumer.offsets_for_times([TopicPartition(topic, 0, produced[-1].timestamp + 1)],
                                          timeout=10)
        assert past[0].offset == -1  # no such record: the end (OFFSET_END)
    finally:
        consumer.close()


def test_consumer_long_poll_sees_records_produced_after_it_started(broker):
    topic = unique_topic("confluent-tail")
    confluent_create_topic(broker.bootstrap_servers, topic, 1)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": "unused",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 5000})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert consumer.poll(0.5) is None
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers,
                             "enable.idempotence": True})
        producer.produce(topic, value=b"late", key=b"k")
        assert producer.flush(DEADLINE_S) == 0
        msg = consumer.poll(DEADLINE_S)
        assert msg is not None and msg.error() is None
        assert (msg.offset(), msg.value()) == (0, b"late")
    finally:
        consumer.close()


@pytest.mark.parametrize("consumer", ["kafka-python", "aiokafka", "kcat"])
def test_records_produced_by_confluent_decode_in_other_clients(broker, consumer):
    if consumer == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (Debian package kcat)")
    topic = unique_topic(f"from-confluent-to-{consumer}")
    confluent_create_topic(broker.bootstrap_servers, topic, PARTITIONS)
    produced = []
    for n, codec in enumerate(c for c in CODECS["confluent"] if c in CODECS[consumer]):
        produced += confluent_produce(broker.bootstrap_servers, topic,
                                      dataset(codec, 90, start=90 * n,
                                              text_only=consumer == "kcat"),
                                      PARTITIONS, codec)
    consumed = CONSUMERS[consumer](broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS)

"""aiokafka against a real broker process: admin, idempotent produce with every codec (through
cramjam, already a dependency), group-less consume, and its records read by the other clients."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from support.interop import (
    CODECS,
    CONSUMERS,
    KCAT,
    aiokafka_consume,
    aiokafka_produce,
    check_consumed,
    dataset,
    unique_topic,
)

from oncelog.harness.broker_process import BrokerProcess

pytestmark = pytest.mark.slow

PARTITIONS = 3
TOPIC_ALREADY_EXISTS = 36
INVALID_TOPIC_EXCEPTION = 17


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerProcess(tmp_path_factory.mktemp("aiokafka") / "data") as b:
        yield b
        assert b.running, b.log_tail()


async def _admin(bootstrap, action):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await action(admin)
    finally:
        await admin.close()


def create_topic(bootstrap, topic, partitions=PARTITIONS):
    async def create(admin):
        response = await admin.create_topics([NewTopic(topic, partitions, 1)])
        assert [e[1] for e in response.topic_errors] == [0], response

    asyncio.run(_admin(bootstrap, create))


def test_admin_creates_describes_and_deletes_topics(broker):
    topic = unique_topic("aio-admin")

    async def scenario(admin):
        r = await admin.create_topics([NewTopic(topic, 2, 1,
                                                topic_configs={"retention.ms": "3600000"})])
        assert [e[1] for e in r.topic_errors] == [0]
        r = await admin.create_topics([NewTopic(topic, 1, 1)])
        assert [e[1] for e in r.topic_errors] == [TOPIC_ALREADY_EXISTS]
        r = await admin.create_topics([NewTopic("no/slashes", 1, 1)])
        assert [e[1] for e in r.topic_errors] == [INVALID_TOPIC_EXCEPTION]

        assert topic in await admin.list_topics()
        (desc,) = await admin.describe_topics([topic])
        assert sorted(p["partition"] for p in desc["partitions"]) == [0, 1]

        (configs,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic)])
        (resource,) = configs.resources
        values = {entry[0]: entry[1] for entry in resource[4]}
        assert values["retention.ms"] == "3600000"

        await admin.delete_topics([topic])
        assert topic not in await admin.list_topics()

    asyncio.run(_admin(broker.bootstrap_servers, scenario))


@pytest.mark.parametrize("codec", CODECS["aiokafka"])
def test_idempotent_produce_then_consume_exact_records_and_offsets(broker, codec):
    topic = unique_topic(f"aio-{codec}")
    create_topic(broker.bootstrap_servers, topic)
    produced = aiokafka_produce(broker.bootstrap_servers, topic, dataset(codec, 300),
                                PARTITIONS, codec)
    consumed = aiokafka_consume(broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS)


def test_offsets_for_times_and_long_poll(broker):
    topic = unique_topic("aio-offsets")
    create_topic(broker.bootstrap_servers, topic, 1)
    produced = aiokafka_produce(broker.bootstrap_servers, topic, dataset("ts", 40), 1, "zstd")

    async def scenario():
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None,
                                    enable_auto_commit=False, fetch_max_wait_ms=5000)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            r = produced[23]
            found = (await consumer.offsets_for_times({tp: r.timestamp}))[tp]
            assert (found.offset, found.timestamp) == (r.offset, r.timestamp)
            assert (await consumer.end_offsets([tp]))[tp] == 40
            # Positioned at the end, a fetch waits for the next record.
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            waiting = asyncio.ensure_future(consumer.getone(tp))
            await asyncio.to_thread(aiokafka_produce, broker.bootstrap_servers, topic,
                                    dataset("late", 1, start=40), 1, "none")
            msg = await asyncio.wait_for(waiting, 30)
            assert msg.offset == 40 and msg.value == b"value-late-00040"
        finally:
            await consumer.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("consumer", ["confluent", "kafka-python", "kcat"])
def test_records_produced_by_aiokafka_decode_in_other_clients(broker, consumer):
    if consumer == "kcat" and KCAT is None:
        pytest.skip("kcat is not installed (Debian package kcat)")
    topic = unique_topic(f"from-aio-to-{consumer}")
    create_topic(broker.bootstrap_servers, topic)
    produced = []
    codecs = [c for c in CODECS["aiokafka"] if c in CODECS[consumer]]
    for n, codec in enumerate(codecs):
        produced += aiokafka_produce(
            broker.bootstrap_servers, topic,
            dataset(f"aio-{codec}", 90, start=90 * n, text_only=consumer == "kcat"),
            PARTITIONS, codec)
    consumed = CONSUMERS[consumer](broker.bootstrap_servers, topic, PARTITIONS)
    check_consumed(produced, consumed, partitions=PARTITIONS)

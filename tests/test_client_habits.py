"""What Python Kafka users reach for, through the public client against real brokers:
``pause``/``resume``/``paused``, ``list_topics``, key/value (de)serializers, a per-send
``on_delivery`` callback, error class names without ``ExceptionError``, a bounded ``close``
when the broker is gone, and ``oncelog consume`` ending at a second Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import threading
import time
import uuid
import warnings

import pytest
from support.cli import ONCELOG, oncelog

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog import errors as oncelog_errors
from oncelog.client.errors import SerializationError
from oncelog.errors import (
    InvalidTopicError,
    KafkaStorageError,
    NetworkError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from oncelog.harness.broker_process import BrokerProcess


def topic_name() -> str:
    return f"h-{uuid.uuid4().hex[:8]}"


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    with Admin(bootstrap_servers=bootstrap) as admin:
        admin.create_topics([NewTopic(topic, partitions)])


def poll_until(consumer: Consumer, count: int, seconds: float = 30) -> list:
    got: list = []
    end = time.monotonic() + seconds
    while len(got) < count and time.monotonic() < end:
        got += consumer.poll(0.5)
    return got


def test_pause_keeps_a_partitions_records_and_position_until_resume(embedded_broker):
    bootstrap = embedded_broker.bootstrap_servers
    topic = topic_name()
    create(bootstrap, topic, 2)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Producer(bootstrap_servers=bootstrap) as producer:
        for i in range(5):
            producer.send(topic, f"a{i}".encode(), partition=0)
            producer.send(topic, f"b{i}".encode(), partition=1)
    with Consumer(bootstrap_servers=bootstrap, max_poll_records=1) as consumer:
        consumer.assign([p0, p1])
        consumer.seek_to_beginning()
        first = poll_until(consumer, 1)  # one record returned, the fetches' rest buffered
        while consumer.current_lag(p0) is None or consumer.current_lag(p1) is None:
            first += consumer.poll(0.2)  # until both partitions' fetches are in
        position = consumer.position(p0)
        assert position < 5  # some of p0's records are still buffered
        consumer.pause(p0)
        assert consumer.paused() == {p0}
        rest = poll_until(consumer, 10, seconds=3)  # only p1's, buffered or fetched
        assert {r.partition for r in rest} <= {1}
        assert [r.value for r in first + rest if r.partition == 1] == \
            [f"b{i}".encode() for i in range(5)]
        assert consumer.position(p0) == position
        consumer.resume(p0)
        assert consumer.paused() == set()
        after = poll_until(consumer, 5 - position)
        assert [r.value for r in after] == [f"a{i}".encode() for i in range(position, 5)]
        with pytest.raises(ValueError):
            consumer.pause(TopicPartition(topic, 7))  # not assigned


def test_list_topics_on_the_producer_and_the_consumer(embedded_broker):
    bootstrap = embedded_broker.bootstrap_servers
    names = sorted([topic_name(), topic_name()])
    for name in names:
        create(bootstrap, name)
    with Producer(bootstrap_servers=bootstrap) as producer:
        listed = producer.list_topics()
    assert set(names) <= set(listed) and listed == sorted(listed)
    with Consumer(bootstrap_servers=bootstrap, group_id="g") as consumer:
        consumer.subscribe(names)
        poll_until(consumer, 1, seconds=2)  # __consumer_offsets now exists: still left out
        assert consumer.list_topics() == sorted(consumer.topics())
        assert set(names) <= consumer.topics()
        assert not any(t.startswith("__") for t in consumer.topics())


def test_serializers_and_deserializers(embedded_broker):
    bootstrap = embedded_broker.bootstrap_servers
    topic = topic_name()
    create(bootstrap, topic)

    class Upper:  # Kafka's Serializer shape: serialize(topic, data)
        def serialize(self, t: str, data: str) -> bytes:
            assert t == topic
            return data.upper().encode()

    with Producer(bootstrap_servers=bootstrap, key_serializer=Upper(),
                  value_serializer=lambda v: json.dumps(v).encode()) as producer:
        producer.send(topic, {"n": 1}, key="k").result(30)
        producer.send(topic, None, key="tomb").result(30)  # a tombstone stays one
        with pytest.raises(SerializationError):
            producer.send(topic, {"not json": {1, 2}})
    with Consumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                  key_deserializer=bytes.decode, value_deserializer=json.loads) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        got = poll_until(consumer, 2)
    assert [(r.key, r.value) for r in got] == [("K", {"n": 1}), ("TOMB", None)]


def test_on_delivery_is_called_once_per_record(embedded_broker):
    bootstrap = embedded_broker.bootstrap_servers
    topic = topic_name()
    create(bootstrap, topic)
    calls: list = []
    lock = threading.Lock()

    def delivered(err, metadata):
        with lock:
            calls.append((err, metadata, threading.current_thread().name))

    with Producer(bootstrap_servers=bootstrap) as producer:
        futures = [producer.send(topic, f"v{i}".encode(), on_delivery=delivered)
                   for i in range(3)]
        failed = producer.send(topic, b"x", partition=5, on_delivery=delivered)
        producer.flush(30)
    assert [f.result().offset for f in futures] == [0, 1, 2]
    ok = sorted((c for c in calls if c[0] is None), key=lambda c: c[1].offset)
    assert [(c[1].topic, c[1].partition, c[1].offset) for c in ok] == \
        [(topic, 0, 0), (topic, 0, 1), (topic, 0, 2)]
    errors = [c for c in calls if c[0] is not None]
    assert len(errors) == 1 and isinstance(errors[0][0], UnknownTopicOrPartitionError)
    assert errors[0][1] is None and failed.exception() is errors[0][0]
    assert len(calls) == 4


def test_error_names_are_clean_and_old_ones_still_import():
    assert error_for_code(13) is NetworkError
    assert error_for_code(-1) is UnknownServerError
    assert error_for_code(17) is InvalidTopicError
    assert error_for_code(56) is KafkaStorageError
    names = [n for n in dir(oncelog_errors) if n.endswith("Error")]
    assert not [n for n in names if n.endswith(("ExceptionError", "ErrorError"))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from oncelog.errors import NetworkExceptionError
    assert NetworkExceptionError is NetworkError
    assert any(issubclass(w.category, DeprecationWarning) and "NetworkError" in str(w.message)
               for w in caught)
    with pytest.raises(ImportError):
        from oncelog.errors import NoSuchThingError  # noqa: F401


# -- close when the broker is gone ------------------------------------------------------------


def test_close_is_bounded_when_the_broker_is_gone(tmp_path, caplog):
    topic = topic_name()
    with BrokerProcess(tmp_path / "data", settings={
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": "1"}) as broker:
        bootstrap = broker.bootstrap_servers
        create(bootstrap, topic)
        producer = Producer(bootstrap_servers=bootstrap)
        producer.send(topic, b"one").result(30)
        consumer = Consumer(bootstrap_servers=bootstrap, group_id="bounded",
                            auto_offset_reset="earliest")
        consumer.subscribe([topic])
        assert [r.value for r in poll_until(consumer, 1)] == [b"one"]
        broker.kill()
        unsent = producer.send(topic, b"never acknowledged")
        caplog.set_level(logging.WARNING)
        started = time.monotonic()
        consumer.close(timeout=2)
        consumer_took = time.monotonic() - started
        started = time.monotonic()
        producer.close(timeout=2)
        producer_took = time.monotonic() - started
    # generous bounds, far above the 2 s asked and far below the 60 s commit retries of before
    assert consumer_took < 20, consumer_took
    assert producer_took < 20, producer_took
    assert "final offset commit" in caplog.text
    assert unsent.done() and unsent.exception() is not None


def test_a_second_ctrl_c_ends_oncelog_consume_at_once(tmp_path):
    topic = topic_name()
    with BrokerProcess(tmp_path / "data", settings={
            "group.initial.rebalance.delay.ms": "0",
            "offsets.topic.num.partitions": "1"}) as broker:
        bs = ["--bootstrap-server", broker.bootstrap_servers]
        oncelog("topics", "create", *bs, "--topic", topic)
        oncelog("produce", *bs, "--topic", topic, stdin="one\n")
        consumer = subprocess.Popen(
            [*ONCELOG, "consume", *bs, "--topic", topic, "--group", "ctrl-c",
             "--from-beginning"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert consumer.stdout is not None
            assert consumer.stdout.readline() == "one\n"
            broker.kill()
            consumer.send_signal(signal.SIGINT)  # a clean end: its commit waits for a broker
            time.sleep(1)
            assert consumer.poll() is None, "the first Ctrl-C should wait for the commit"
            consumer.send_signal(signal.SIGINT)
            _, err = consumer.communicate(timeout=20)
        finally:
            if consumer.poll() is None:
                consumer.kill()
                consumer.wait()
    assert consumer.returncode == 130, err
    assert "Interrupted again" in err


def test_the_asyncio_clients_have_them_too(embedded_broker):
    from oncelog.aio import AsyncConsumer, AsyncProducer

    bootstrap = embedded_broker.bootstrap_servers
    topic = topic_name()
    create(bootstrap, topic)
    tp = TopicPartition(topic, 0)
    calls: list = []

    async def main() -> list:
        async with AsyncProducer(bootstrap_servers=bootstrap,
                                 value_serializer=str.encode) as producer:
            assert topic in await producer.list_topics()
            for i in range(4):
                await (await producer.send(topic, f"v{i}",
                                           on_delivery=lambda e, m: calls.append((e, m))))
        async with AsyncConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                 value_deserializer=bytes.decode) as consumer:
            consumer.assign([tp])
            first = await consumer.getone()  # the rest of the fetch is buffered
            await consumer.pause(tp)
            assert consumer.paused() == {tp}
            assert await consumer.poll(0.5) == []
            await consumer.resume(tp)
            got = [first.value]
            while len(got) < 4:
                got.append((await consumer.getone()).value)
            return got

    assert asyncio.run(main()) == ["v0", "v1", "v2", "v3"]
    assert [(e, m.offset) for e, m in calls] == [(None, 0), (None, 1), (None, 2), (None, 3)]

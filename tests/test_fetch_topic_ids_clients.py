"""Clients that fetch by topic id (KIP-516): librdkafka (confluent-kafka) negotiates Fetch v16
(its newest) and our consumer v17, seen in the broker's request counters by version; our Admin
deletes by topic id and describes it."""

from __future__ import annotations

import re
import urllib.request
import uuid

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog import Admin, Consumer, Producer
from oncelog import NewTopic as OurNewTopic
from oncelog.client.types import TopicPartition
from oncelog.errors import UnknownTopicIdError
from oncelog.server.embedded import EmbeddedBroker


@pytest.fixture(scope="module")
def broker():
    with EmbeddedBroker(config={"metrics.port": "0"}) as b:
        yield b


def fetch_versions(broker) -> dict[int, int]:
    """Fetch requests answered so far, by version, from the metrics page."""
    url = f"http://127.0.0.1:{broker.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {int(v): int(n) for v, n in re.findall(
        r'^oncelog_requests_total\{request="Fetch",version="(\d+)"\} (\d+)$', text,
        re.MULTILINE)}


def test_confluent_kafka_fetches_by_topic_id_with_v16(broker):
    topic = f"rdk-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    p = ConfluentProducer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(20):
        p.produce(topic, f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    before = fetch_versions(broker).get(16, 0)
    c = ConfluentConsumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": topic,
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        c.subscribe([topic])
        got: list[bytes] = []
        for _ in range(200):
            if len(got) >= 20:
                break
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(20))
    # librdkafka asks for Fetch up to v16 and names topics by id from v13 on.
    assert fetch_versions(broker).get(16, 0) > before


def test_our_consumer_fetches_by_topic_id_with_v17(broker):
    topic = f"ours-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([OurNewTopic(topic, 1, 1)])
    with Producer(bootstrap_servers=broker.bootstrap_servers) as p:
        for i in range(5):
            p.send(topic, f"v{i}".encode()).result(10)
    before = fetch_versions(broker).get(17, 0)
    with Consumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                  fetch_max_wait_ms=10) as c:
        c.assign([TopicPartition(topic, 0)])
        got: list[bytes] = []
        for _ in range(50):
            got.extend(r.value for r in c.poll(timeout=0.5))
            if len(got) >= 5:
                break
    assert got == [f"v{i}".encode() for i in range(5)]
    assert fetch_versions(broker).get(17, 0) > before


def test_admin_describes_and_deletes_topics_by_id(broker):
    topic = f"adm-{uuid.uuid4().hex[:8]}"
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
        admin.create_topics([OurNewTopic(topic, 1, 1)])
        tid = admin.describe_topics([topic])[topic].topic_id
        assert isinstance(tid, uuid.UUID) and tid.int
        admin.delete_topics([tid])
        assert topic not in admin.list_topics()
        with pytest.raises(UnknownTopicIdError):
            admin.delete_topics([tid])


def test_our_consumer_follows_a_topic_deleted_and_recreated_under_its_name(broker):
    """The old id's fetches are answered UNKNOWN_TOPIC_ID: the consumer refreshes its metadata,
    fetches the new topic by its new id, finds its old position out of range and starts over
    from the earliest offset (auto_offset_reset); nothing of the old topic is read twice."""
    topic = f"again-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    with Admin(bootstrap_servers=broker.bootstrap_servers) as admin, \
            Producer(bootstrap_servers=broker.bootstrap_servers) as p, \
            Consumer(bootstrap_servers=broker.bootstrap_servers, auto_offset_reset="earliest",
                     fetch_max_wait_ms=10) as c:
        admin.create_topics([OurNewTopic(topic, 1, 1)])
        for i in range(5):
            p.send(topic, f"old{i}".encode()).result(10)
        c.assign([tp])
        got: list[bytes] = []
        for _ in range(50):
            got.extend(r.value for r in c.poll(timeout=0.5))
            if len(got) >= 5:
                break
        assert got == [f"old{i}".encode() for i in range(5)] and c.position(tp) == 5
        old_id = admin.describe_topics([topic])[topic].topic_id
        admin.delete_topics([old_id])
        admin.create_topics([OurNewTopic(topic, 1, 1)])
        assert admin.describe_topics([topic])[topic].topic_id != old_id
        for i in range(2):
            p.send(topic, f"new{i}".encode()).result(10)
        got = []
        for _ in range(60):
            got.extend(r.value for r in c.poll(timeout=0.5))
            if len(got) >= 2:
                break
        assert got == [b"new0", b"new1"]

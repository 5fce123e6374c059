"""Produce with our Producer, read back with our Consumer: every codec, positions, seeks, resets.

``any_broker`` runs each test against the EmbeddedBroker and against librdkafka's mock cluster
(three brokers, so partitions have different leaders), two independent implementations.
"""

from __future__ import annotations

import pytest

from oncelog import Consumer, ConsumerRecord, Producer, TopicPartition
from oncelog.client import NoOffsetForPartitionError
from oncelog.errors import OffsetOutOfRangeError


@pytest.fixture(params=[pytest.param("embedded", marks=pytest.mark.broker), "mock"])
def any_broker(request):
    if request.param == "embedded":
        return request.getfixturevalue("embedded_broker").bootstrap_servers
    return request.getfixturevalue("mock_cluster").bootstrap_servers


def poll_until(consumer: Consumer, count: int, timeout: float = 10.0) -> list[ConsumerRecord]:
    """Poll until ``count`` records arrived (each poll waits on the broker's long poll)."""
    import time

    out: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out += consumer.poll(timeout=max(0.0, deadline - time.monotonic()))
    return out


def consumer(servers: str, **kwargs) -> Consumer:
    return Consumer(bootstrap_servers=servers, fetch_max_wait_ms=100, **kwargs)


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_then_consume_with_each_codec(any_broker, codec):
    topic = f"codec-{codec}"
    sent = [(f"k{i}".encode(), f"value-{i}-{codec}".encode() * (i % 5 + 1)) for i in range(50)]
    with Producer(bootstrap_servers=any_broker, compression_type=codec) as producer:
        futures = [producer.send(topic, v, key=k, partition=0, headers=[("n", str(i).encode())])
                   for i, (k, v) in enumerate(sent)]
        producer.flush(10)
        metadata = [f.result(0) for f in futures]
    assert [md.offset for md in metadata] == list(range(50))
    with consumer(any_broker, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition(topic, 0)])
        records = poll_until(c, 50)
    assert [(r.key, r.value) for r in records] == sent
    assert [r.offset for r in records] == list(range(50))
    assert [r.headers for r in records] == [[("n", str(i).encode())] for i in range(50)]
    assert all(r.topic == topic and r.partition == 0 for r in records)


def test_futures_carry_offsets_and_timestamps(embedded_broker):
    servers = embedded_broker.bootstrap_servers
    with Producer(bootstrap_servers=servers) as producer:
        mds = [producer.send("ts", b"v", partition=0, timestamp_ms=1_600_000_000_000 + i)
               .result(10) for i in range(3)]
    assert [(md.topic, md.partition, md.offset, md.timestamp) for md in mds] == \
        [("ts", 0, i, 1_600_000_000_000 + i) for i in range(3)]
    with consumer(servers, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("ts", 0)])
        records = poll_until(c, 3)
    assert [(r.timestamp, r.timestamp_type) for r in records] == \
        [(1_600_000_000_000 + i, 0) for i in range(3)]


def test_str_is_encoded_and_none_stays_none(any_broker):
    with Producer(bootstrap_servers=any_broker) as producer:
        producer.send("strs", "héllo", key="ключ", partition=0, headers={"h": "v"}).result(10)
        producer.send("strs", None, partition=0).result(10)
    with consumer(any_broker, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("strs", 0)])
        a, b = poll_until(c, 2)
    assert (a.key, a.value, a.headers) == ("ключ".encode(), "héllo".encode(), [("h", b"v")])
    assert (b.key, b.value, b.headers) == (None, None, [])


def test_seek_position_and_seek_to_end_and_beginning(any_broker):
    tp = TopicPartition("seeks", 0)
    with Producer(bootstrap_servers=any_broker) as producer:
        for i in range(10):
            producer.send(tp.topic, f"v{i}", partition=0)
        producer.flush(10)
    with consumer(any_broker, auto_offset_reset="earliest") as c:
        c.assign([tp])
        assert c.assignment() == {tp}
        assert c.position(tp) == 0  # earliest, looked up with ListOffsets
        c.seek_to_end(tp)
        assert c.position(tp) == 10
        assert c.poll(timeout=0.2) == []
        c.seek(tp, 7)
        assert c.position(tp) == 7
        assert [r.value for r in poll_until(c, 3)] == [b"v7", b"v8", b"v9"]
        assert c.position(tp) == 10
        c.seek_to_beginning()
        assert c.position(tp) == 0
        assert [r.offset for r in poll_until(c, 10)] == list(range(10))


def test_seek_to_end_is_resolved_lazily(any_broker):
    tp = TopicPartition("lazy-end", 0)
    with Producer(bootstrap_servers=any_broker) as producer:
        producer.send(tp.topic, b"before", partition=0).result(10)
        with consumer(any_broker) as c:
            c.assign([tp])
            c.seek_to_end(tp)
            producer.send(tp.topic, b"after", partition=0).result(10)
            assert c.position(tp) == 2  # the end as of now, not as of seek_to_end()


def test_auto_offset_reset_latest_reads_only_new_records(any_broker):
    tp = TopicPartition("latest", 0)
    with Producer(bootstrap_servers=any_broker) as producer:
        producer.send(tp.topic, b"old", partition=0).result(10)
        with consumer(any_broker, auto_offset_reset="latest") as c:
            c.assign([tp])
            assert c.position(tp) == 1
            producer.send(tp.topic, b"new", partition=0).result(10)
            assert [r.value for r in poll_until(c, 1)] == [b"new"]


def test_auto_offset_reset_none_needs_a_seek(embedded_broker):
    tp = TopicPartition("none-reset", 0)
    servers = embedded_broker.bootstrap_servers
    with Producer(bootstrap_servers=servers) as producer:
        producer.send(tp.topic, b"v", partition=0).result(10)
    with consumer(servers, auto_offset_reset="none") as c:
        c.assign([tp])
        with pytest.raises(NoOffsetForPartitionError):
            c.poll(timeout=0.5)
        c.seek(tp, 5)  # past the end
        with pytest.raises(OffsetOutOfRangeError):
            poll_until(c, 1, timeout=2)
        c.seek(tp, 0)
        assert [r.value for r in poll_until(c, 1)] == [b"v"]


def test_out_of_range_position_is_reset_by_auto_offset_reset(any_broker):
    tp = TopicPartition("oor", 0)
    with Producer(bootstrap_servers=any_broker) as producer:
        for i in range(3):
            producer.send(tp.topic, f"v{i}", partition=0)
        producer.flush(10)
    with consumer(any_broker, auto_offset_reset="earliest") as c:
        c.assign([tp])
        c.seek(tp, 1000)
        assert [r.offset for r in poll_until(c, 3)] == [0, 1, 2]


def test_a_seek_mid_batch_skips_the_records_before_it(any_broker):
    tp = TopicPartition("midbatch", 0)
    with Producer(bootstrap_servers=any_broker, linger_ms=60000) as producer:
        for i in range(10):
            producer.send(tp.topic, f"v{i}", partition=0)
        producer.flush(10)  # one batch of ten
    with consumer(any_broker) as c:
        c.assign([tp])
        c.seek(tp, 4)
        assert [r.offset for r in poll_until(c, 6)] == list(range(4, 10))


def test_consumes_several_partitions_led_by_different_brokers(mock_cluster):
    servers = mock_cluster.bootstrap_servers
    with Producer(bootstrap_servers=servers) as producer:
        for p in range(4):  # the mock creates topics with 4 partitions over its 3 brokers
            for i in range(5):
                producer.send("spread", f"{p}-{i}", partition=p)
        producer.flush(10)
    with consumer(servers, auto_offset_reset="earliest", max_poll_records=3) as c:
        c.assign([TopicPartition("spread", p) for p in range(4)])
        records = poll_until(c, 20)
    by_partition = {p: [r.value for r in records if r.partition == p] for p in range(4)}
    assert by_partition == {p: [f"{p}-{i}".encode() for i in range(5)] for p in range(4)}


def test_max_poll_records_bounds_one_poll(embedded_broker):
    servers = embedded_broker.bootstrap_servers
    tp = TopicPartition("bounded", 0)
    with Producer(bootstrap_servers=servers) as producer:
        for i in range(10):
            producer.send(tp.topic, f"v{i}", partition=0)
        producer.flush(10)
    with consumer(servers, auto_offset_reset="earliest", max_poll_records=4) as c:
        c.assign([tp])
        first = c.poll(timeout=5)
        assert [r.offset for r in first] == [0, 1, 2, 3]
        assert c.position(tp) == 4
        assert [r.offset for r in poll_until(c, 6)] == list(range(4, 10))


def test_subscribe_needs_a_group_and_topics_and_does_not_mix_with_assign(any_broker):
    with consumer(any_broker) as c, pytest.raises(ValueError, match="needs a group_id"):
        c.subscribe(["t"])
    with Consumer(bootstrap_servers=any_broker, group_id="g") as c:
        with pytest.raises(ValueError, match="topics or a pattern"):
            c.subscribe([])
        c.subscribe(["t"])
        with pytest.raises(ValueError, match="cannot be mixed"):
            c.assign([TopicPartition("t", 0)])


def test_poll_needs_an_assignment_and_an_open_consumer(any_broker):
    c = consumer(any_broker)
    with pytest.raises(RuntimeError, match="no partitions assigned"):
        c.poll(timeout=0)
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.assign([TopicPartition("t", 0)])

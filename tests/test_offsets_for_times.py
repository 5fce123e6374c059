"""Consumer.offsets_for_times (Kafka's offsetsForTimes) against a real broker: the first offset
at or after a timestamp, None past the last record, and, as Kafka's broker answers, None for a
record the consumer may not read yet (an open transaction's, under read_committed)."""

from __future__ import annotations

import time

import pytest

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from oncelog.client import OffsetAndTimestamp
from oncelog.server.embedded import EmbeddedBroker

# Recent record timestamps: retention (7 days by default) must not take them.
T = (int(time.time()) - 3600) * 1000


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with EmbeddedBroker(data_dir=tmp_path_factory.mktemp("data")) as b:
        with Admin(bootstrap_servers=b.bootstrap_servers) as a:
            a.create_topics([NewTopic("times", 2)])
        yield b


def test_offsets_for_times_finds_the_first_record_at_or_after_each_timestamp(broker):
    with Producer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0) as p:
        for i, ts in enumerate((1000, 2000, 2000, 3000)):
            p.send("times", f"r{i}".encode(), partition=0, timestamp_ms=T + ts).result(10)
    tp0, tp1 = TopicPartition("times", 0), TopicPartition("times", 1)
    with Consumer(bootstrap_servers=broker.bootstrap_servers) as c:
        got = c.offsets_for_times({tp0: T + 1500, tp1: 0})
        assert got == {tp0: OffsetAndTimestamp(1, T + 2000), tp1: None}  # tp1 holds no record
        assert c.offsets_for_times({tp0: 0})[tp0] == OffsetAndTimestamp(0, T + 1000)
        assert c.offsets_for_times({tp0: T + 3000})[tp0] == OffsetAndTimestamp(3, T + 3000)
        assert c.offsets_for_times({tp0: T + 3001}) == {tp0: None}
        assert c.offsets_for_times({}) == {}
        with pytest.raises(ValueError, match="times-0 is -1: it cannot be negative"):
            c.offsets_for_times({tp0: -1})


def test_a_record_past_the_last_stable_offset_is_no_answer_under_read_committed(broker):
    tp = TopicPartition("times", 1)
    p = Producer(bootstrap_servers=broker.bootstrap_servers, transactional_id="times-t",
                 linger_ms=0)
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("times", b"open", partition=1, timestamp_ms=T + 5000)
        p.flush()
        with Consumer(bootstrap_servers=broker.bootstrap_servers,
                      isolation_level="read_committed") as committed, \
                Consumer(bootstrap_servers=broker.bootstrap_servers) as uncommitted:
            assert committed.offsets_for_times({tp: T + 5000}) == {tp: None}
            assert uncommitted.offsets_for_times({tp: T + 5000}) == {
                tp: OffsetAndTimestamp(0, T + 5000)}
            p.commit_transaction()
            assert committed.offsets_for_times({tp: T + 5000}) == {
                tp: OffsetAndTimestamp(0, T + 5000)}
    finally:
        p.close()

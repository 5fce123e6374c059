"""The consumer fetches a partition again while it still returns that partition's records
(client/consumer/fetcher.py, PREFETCH): a partition read across many fetches, beside idle ones, is never
held up by a long poll (fetch.max.wait.ms) on the idle ones; records come in order, once each,
through poll, poll_columns, both mixed, and a seek in the middle."""

from __future__ import annotations

import pytest

from oncelog import Admin, Consumer, NewTopic, Producer, TopicPartition

VALUE = b"v" * 1000
RECORDS = 400  # about 7 fetches of partition 0 at 64 KB a fetch
# Long enough that one long poll would show as many empty polls
CONSUMER = {"fetch_max_wait_ms": 5000, "max_partition_fetch_bytes": 64 * 1024,
            "auto_offset_reset": "earliest"}


@pytest.fixture(scope="module")
def topic():
    from oncelog.server.embedded import EmbeddedBroker

    with EmbeddedBroker() as broker:
        with Admin(bootstrap_servers=broker.bootstrap_servers) as admin:
            admin.create_topics([NewTopic("prefetch", 4, 1)])
        with Producer(bootstrap_servers=broker.bootstrap_servers) as producer:
            producer.send_batch("prefetch", [VALUE] * RECORDS, partition=0).result(30)
        yield broker.bootstrap_servers, [TopicPartition("prefetch", p) for p in range(4)]


def test_a_busy_partition_is_not_held_up_by_idle_ones(topic):
    bootstrap, partitions = topic
    with Consumer(bootstrap_servers=bootstrap, max_poll_records=50, **CONSUMER) as consumer:
        consumer.assign(partitions)
        offsets: list[int] = []
        empty = 0
        while len(offsets) < RECORDS and empty < 10:
            records = consumer.poll(1.0)
            empty += not records
            offsets += [r.offset for r in records]
        # Without prefetching, each of partition 0's fetches after the first waited behind a
        # long poll on partitions 1-3: five empty polls of a second each time.
        assert empty == 0
        assert offsets == list(range(RECORDS))


def test_poll_columns_and_poll_mixed_with_a_seek(topic):
    bootstrap, partitions = topic
    with Consumer(bootstrap_servers=bootstrap, max_poll_records=30, **CONSUMER) as consumer:
        consumer.assign(partitions)
        got: list[int] = []
        turn = 0
        while len(got) < RECORDS:
            turn += 1
            assert turn < 100
            if turn == 3:
                assert len(got) > 10
                consumer.seek(partitions[0], 10)  # drops what was buffered, prefetched too
                got = got[:10]
            if turn % 2:
                got += [r.offset for r in consumer.poll(1.0)]
            else:
                for tp, columns in consumer.poll_columns(1.0).items():
                    assert tp == partitions[0]
                    got += columns.offsets().tolist()
            assert consumer.position(partitions[0]) == (got[-1] + 1 if got else 0)
        assert got == list(range(RECORDS))

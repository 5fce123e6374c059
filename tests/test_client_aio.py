"""The Consumer as an iterable, and the asyncio faces (oncelog.aio) against a real broker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from oncelog import Consumer, Producer, TopicPartition
from oncelog.aio import AsyncConsumer, AsyncProducer
from oncelog.errors import InvalidTopicError


def test_iterating_a_consumer_yields_records_and_ends_after_consumer_timeout_ms(
        embedded_broker):
    servers = embedded_broker.bootstrap_servers
    with Producer(bootstrap_servers=servers) as producer:
        for i in range(30):
            producer.send("iter", f"v{i}".encode(), partition=0)
    with Consumer(bootstrap_servers=servers, auto_offset_reset="earliest",
                  max_poll_records=7, fetch_max_wait_ms=50, consumer_timeout_ms=500) as c:
        c.assign([TopicPartition("iter", 0)])
        started = time.monotonic()
        values = [r.value for r in c]  # ends by itself: 0.5 s without a record
        waited = time.monotonic() - started
    assert values == [f"v{i}".encode() for i in range(30)]
    assert waited >= 0.5


def test_iterating_without_timeout_waits_for_records_produced_later(embedded_broker):
    servers = embedded_broker.bootstrap_servers
    with Producer(bootstrap_servers=servers) as producer:
        producer.send("iter-late", b"first", partition=0).result(10)

        def later() -> None:
            time.sleep(1.5)  # longer than one of the iterator's 1 s polls
            producer.send("iter-late", b"second", partition=0)

        with Consumer(bootstrap_servers=servers, auto_offset_reset="earliest",
                      fetch_max_wait_ms=50) as c:
            c.assign([TopicPartition("iter-late", 0)])
            thread = threading.Thread(target=later)
            thread.start()
            seen = []
            for record in c:
                seen.append(record.value)
                if len(seen) == 2:
                    break
            thread.join()
    assert seen == [b"first", b"second"]


def test_async_producer_and_consumer_in_a_transaction(embedded_broker):
    servers = embedded_broker.bootstrap_servers

    async def main() -> tuple[list, list, list]:
        async with AsyncProducer(bootstrap_servers=servers, transactional_id="aio-tx") as p:
            await p.init_transactions()
            await p.begin_transaction()
            pending = [await p.send("aio", f"c{i}".encode(), partition=0) for i in range(5)]
            await p.commit_transaction()
            committed = [(await f).offset for f in pending]
            await p.begin_transaction()
            await p.send_and_wait("aio", b"aborted", partition=0)
            await p.abort_transaction()
        ticks = 0

        async def ticker() -> None:  # the loop stays free while the consumer waits
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        async with AsyncConsumer(bootstrap_servers=servers, group_id="aio-group",
                                 isolation_level="read_committed",
                                 auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
            c.subscribe(["aio"])
            values = []
            async for record in c:
                values.append(record.value)
                if len(values) == 5:
                    break
            assert await c.poll(0.5) == []  # the aborted record is not read
            await c.commit()
            offsets = await c.committed([TopicPartition("aio", 0)])
        tick_task.cancel()
        assert ticks > 10
        return committed, values, [offsets[TopicPartition("aio", 0)]]

    committed, values, offsets = asyncio.run(main())
    assert committed == [0, 1, 2, 3, 4]
    assert values == [f"c{i}".encode() for i in range(5)]
    # 5 records, a commit marker, the aborted record and its abort marker: the end is 8
    assert offsets == [8]


def test_async_consumer_commit_leaves_out_what_was_not_yet_handed_out(embedded_broker):
    servers = embedded_broker.bootstrap_servers
    with Producer(bootstrap_servers=servers) as producer:
        for i in range(10):
            producer.send("aio-partial", f"v{i}".encode(), partition=0)

    async def main() -> dict:
        async with AsyncConsumer(bootstrap_servers=servers, group_id="aio-partial",
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 fetch_max_wait_ms=50) as c:
            c.assign([TopicPartition("aio-partial", 0)])
            first = [(await c.getone()).value for _ in range(3)]
            assert first == [b"v0", b"v1", b"v2"]
            await c.commit()  # the poll returned all 10; only 3 reached us
            return await c.committed([TopicPartition("aio-partial", 0)])

    assert asyncio.run(main()) == {TopicPartition("aio-partial", 0): 3}


def test_async_producer_errors_are_the_sync_ones(embedded_broker):
    async def main() -> None:
        async with AsyncProducer(bootstrap_servers=embedded_broker.bootstrap_servers,
                                 max_block_ms=2000) as p:
            with pytest.raises(InvalidTopicError):
                await p.send_and_wait("bad topic name!", b"v")

    asyncio.run(main())

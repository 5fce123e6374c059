"""asyncio faces of the Producer and the Consumer: ``AsyncProducer`` and ``AsyncConsumer``.

    async with AsyncProducer(bootstrap_servers=addr, transactional_id="copier") as producer:
        await producer.init_transactions()
        await producer.begin_transaction()
        metadata = await producer.send_and_wait("invoices", b"paid", key=b"order-7")
        await producer.commit_transaction()

    async with AsyncConsumer(bootstrap_servers=addr, group_id="billing",
                             auto_offset_reset="earliest") as consumer:
        consumer.subscribe(["invoices"])
        async for record in consumer:
            ...

Why wrappers and not a second client: the synchronous client already does its network work
off the caller's thread where it matters (the producer's sender thread); what an asyncio
program needs is that no call blocks its event loop. Each wrapper runs the blocking calls of
its client on one worker thread of its own, in the order they are made, which also keeps the
Consumer's rule that one thread at a time uses it. A record's delivery is the producer's own
future, bridged to the loop with ``asyncio.wrap_future``: no thread waits per record.

The methods are the synchronous ones' (same names, same arguments, same errors), awaited.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, Self, TypeVar

from .client import Consumer, Producer
from .client.producer.producer import HeadersArg
from .client.producer.transaction_manager import PreparedTxnState
from .client.types import ConsumerGroupMetadata, ConsumerRecord, RecordMetadata, TopicPartition

__all__ = ["AsyncConsumer", "AsyncProducer"]

_T = TypeVar("_T")


class _OnOneThread:
    """Runs a client's blocking calls, one after another, on a thread of its own."""

    def __init__(self, name: str) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor,
                                          functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False)


class _AsyncClient:
    """What both faces share: the worker thread, and ``async with`` closing the client."""

    _thread: _OnOneThread

    async def close(self) -> None:
        """Close the client (and stop its worker thread)."""
        raise NotImplementedError

    async def _close_on_thread(self, close: Callable[..., Any], *args: Any) -> None:
        try:
            await self._thread.call(close, *args)
        finally:
            self._thread.shutdown()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AsyncProducer(_AsyncClient):
    """``Producer`` for asyncio: the same configuration (``Producer``'s docstring), awaited
    methods. ``send`` queues a record and returns an asyncio future of its RecordMetadata;
    ``send_and_wait`` waits for the acknowledgement too."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.producer = Producer(config, **kwargs)
        self._thread = _OnOneThread(f"oncelog-aio-{self.producer.client_id}")

    async def send(self, topic: str, value: Any = None, key: Any = None,
                   partition: int | None = None, headers: HeadersArg = None,
                   timestamp_ms: int | None = None, on_delivery: Any = None
                   ) -> asyncio.Future[RecordMetadata]:
        """Queue a record (``Producer.send``: this waits, off the loop, only while the topic's
        metadata is unknown or the buffer is full); the returned future resolves to the
        record's RecordMetadata once the broker acknowledges it. ``on_delivery`` as
        ``Producer.send``'s (called on the producer's I/O thread, not the event loop's)."""
        delivery = await self._thread.call(self.producer.send, topic, value, key, partition,
                                           headers, timestamp_ms, on_delivery)
        return asyncio.wrap_future(delivery)

    async def list_topics(self, timeout: float | None = None) -> list[str]:
        """``Producer.list_topics``: the topic names, sorted."""
        return await self._thread.call(self.producer.list_topics, timeout)

    async def send_and_wait(self, topic: str, value: bytes | str | None = None,
                            key: bytes | str | None = None, partition: int | None = None,
                            headers: HeadersArg = None, timestamp_ms: int | None = None
                            ) -> RecordMetadata:
        """Send a record and wait until the broker acknowledges it."""
        return await (await self.send(topic, value, key, partition, headers, timestamp_ms))

    async def send_batch(self, topic: str, values: Any, keys: Any = None, **options: Any
                         ) -> list[tuple[int, int]]:
        """``Producer.send_batch`` (column-wise, in bulk), waiting for every acknowledgement."""
        delivery = await self._thread.call(self.producer.send_batch, topic, values, keys,
                                           **options)
        return await asyncio.wrap_future(delivery)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything queued and wait until it is settled."""
        await self._thread.call(self.producer.flush, timeout)

    async def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids."""
        return await self._thread.call(self.producer.partitions_for, topic)

    async def init_transactions(self, timeout: float | None = None,
                                keep_prepared_txn: bool = False) -> None:
        """``Producer.init_transactions``: fence earlier instances of the transactional id."""
        await self._thread.call(self.producer.init_transactions, timeout, keep_prepared_txn)

    async def begin_transaction(self) -> None:
        """Start a transaction."""
        await self._thread.call(self.producer.begin_transaction)

    async def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int] | Any,
                                          group_metadata: ConsumerGroupMetadata | str,
                                          timeout: float | None = None) -> None:
        """Commit consumed offsets as part of the transaction (KIP-447)."""
        await self._thread.call(self.producer.send_offsets_to_transaction, offsets,
                                group_metadata, timeout)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit the transaction."""
        await self._thread.call(self.producer.commit_transaction, timeout)

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction."""
        await self._thread.call(self.producer.abort_transaction, timeout)

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Two-phase commit, phase one (KIP-939)."""
        return await self._thread.call(self.producer.prepare_transaction, timeout)

    async def complete_transaction(self, prepared_txn_state: PreparedTxnState,
                                   timeout: float | None = None) -> None:
        """Two-phase commit recovery: commit the prepared transaction if it is the one named,
        abort it otherwise (KIP-939)."""
        await self._thread.call(self.producer.complete_transaction, prepared_txn_state,
                                timeout)

    async def close(self, timeout: float | None = None) -> None:
        """Send what is queued, wait for it, then stop."""
        await self._close_on_thread(self.producer.close, timeout)


class AsyncConsumer(_AsyncClient):
    """``Consumer`` for asyncio: the same configuration (``Consumer``'s docstring), awaited
    methods, and ``async for record in consumer`` (ending after ``consumer_timeout_ms``
    without a record when that is set, as iterating a Consumer does)."""

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        self.consumer = Consumer(config, **kwargs)
        self._thread = _OnOneThread(f"oncelog-aio-{self.consumer.client_id}")
        self._buffered: deque[ConsumerRecord] = deque()

    def subscribe(self, topics: Iterable[str] | None = None, *,
                  pattern: str | None = None) -> None:
        """Join the group and read what it assigns (``Consumer.subscribe``; no network
        round trip: the group is joined by the next poll)."""
        self.consumer.subscribe(topics, pattern=pattern)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions."""
        self.consumer.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned now."""
        return self.consumer.assignment()

    async def poll(self, timeout: float = 1.0) -> list[ConsumerRecord]:
        """Records from the assigned partitions, waiting up to ``timeout`` seconds."""
        return await self._thread.call(self.consumer.poll, timeout)

    async def poll_columns(self, timeout: float = 1.0) -> dict:
        """``Consumer.poll_columns``: records decoded column-wise, per partition."""
        return await self._thread.call(self.consumer.poll_columns, timeout)

    async def getone(self) -> ConsumerRecord:
        """The next record, waiting as long as it takes."""
        while not self._buffered:
            self._buffered.extend(await self.poll(1.0))
        return self._buffered.popleft()

    async def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        quiet_ms = self.consumer.config.consumer_timeout_ms
        while True:
            while self._buffered:
                yield self._buffered.popleft()
            records = await self.poll(1.0 if quiet_ms < 0 else quiet_ms / 1000)
            if not records and quiet_ms >= 0:
                return
            self._buffered.extend(records)

    async def pause(self, *partitions: TopicPartition) -> None:
        """``Consumer.pause``; records of theirs buffered here go back to the consumer (it
        reads them again after ``resume``)."""
        for tp in partitions:
            first = next((r.offset for r in self._buffered
                          if (r.topic, r.partition) == tuple(tp)), None)
            if first is not None:
                self._drop_buffered(tp)
                await self._thread.call(self.consumer.seek, tp, first)
        await self._thread.call(self.consumer.pause, *partitions)

    async def resume(self, *partitions: TopicPartition) -> None:
        """``Consumer.resume``."""
        await self._thread.call(self.consumer.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        """``Consumer.paused``."""
        return self.consumer.paused()

    async def list_topics(self, timeout: float | None = None) -> list[str]:
        """``Consumer.list_topics``: the topic names, sorted."""
        return await self._thread.call(self.consumer.list_topics, timeout)

    async def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` on (records already buffered for it are
        dropped)."""
        self._drop_buffered(partition)
        await self._thread.call(self.consumer.seek, partition, offset)

    async def seek_to_committed(self, *partitions: TopicPartition,
                                timeout: float | None = None) -> dict[TopicPartition, int | None]:
        """``Consumer.seek_to_committed``: back to the group's committed offsets (all assigned
        partitions if none given), as a copier does after an abort (KAFKA-17582); records
        buffered here for them are dropped."""
        for tp in partitions or tuple(self.consumer.assignment()):
            self._drop_buffered(tp)
        return await self._thread.call(
            lambda: self.consumer.seek_to_committed(*partitions, timeout=timeout))

    def _drop_buffered(self, partition: TopicPartition) -> None:
        self._buffered = deque(r for r in self._buffered
                               if (r.topic, r.partition) != tuple(partition))

    async def position(self, partition: TopicPartition, timeout: float | None = None) -> int:
        """The offset of the next record ``poll`` would return from ``partition``."""
        return await self._thread.call(self.consumer.position, partition, timeout)

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None,
                     timeout: float | None = None) -> None:
        """Commit offsets (the next offset to read per partition; default: the positions of
        what was returned, records still buffered here excluded)."""
        if offsets is None and self._buffered:
            first: dict[TopicPartition, int] = {}
            for r in self._buffered:
                first.setdefault(TopicPartition(r.topic, r.partition), r.offset)
            await self._thread.call(self._commit_up_to, first, timeout)
        else:
            await self._thread.call(self.consumer.commit, offsets, False, timeout)

    def _commit_up_to(self, first_buffered: dict[TopicPartition, int],
                      timeout: float | None) -> None:
        # The consumer's positions count every record poll returned; those still buffered
        # here have not reached the caller: commit up to the first of them instead.
        consumer = self.consumer
        offsets = {tp: consumer.position(tp) for tp in consumer.assignment()}
        offsets.update(first_buffered)
        consumer.commit(offsets, False, timeout)

    async def committed(self, partitions: Iterable[TopicPartition],
                        timeout: float | None = None) -> dict[TopicPartition, int | None]:
        """The group's committed offsets."""
        return await self._thread.call(self.consumer.committed, list(partitions), timeout)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """What ``send_offsets_to_transaction`` needs to fence zombies (KIP-447)."""
        return self.consumer.group_metadata()

    async def close(self, timeout: float | None = None) -> None:
        """Leave the group and close the connections (``Consumer.close``: within
        ``timeout``, default 30 s)."""
        await self._close_on_thread(self.consumer.close, timeout)

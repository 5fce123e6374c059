"""Batching: records wait here, per partition, until the sender drains them (aiokafka's
message_accumulator, the Java client's RecordAccumulator).

``send`` appends on the caller's thread; the sender thread asks which partitions are ready
(batch full, linger.ms passed, a flush or close in progress, or a retry due) and drains them.
One lock guards the queues; futures are completed outside it, because a callback may call
``send`` again.

A batch keeps the sequence number it was first sent with across retries (the broker dedupes on
it), and a retried batch goes back to the front of its queue in sequence order, so that batches
of one partition are always written in the order they were sent.
"""

from __future__ import annotations

import itertools
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Protocol

from ...records import Compression
from ...records.batch import (
    HEADER_SIZE,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    wrap_records,
)
from ...records.columnar import encode_sections
from ..errors import KafkaTimeoutError
from ..metadata import Cluster
from ..types import RecordMetadata, TopicPartition
from .record_future import RecordFuture

Headers = Sequence[tuple[str, bytes | None]]

# Bytes a record costs besides key, value and headers: length, attributes, timestamp and
# offset deltas, key/value lengths, header count (varints; an upper bound is good enough).
RECORD_OVERHEAD = 21


def estimate_record_size(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    size = RECORD_OVERHEAD + len(key or b"") + len(value or b"")
    for hkey, hvalue in headers:
        size += 10 + len(hkey) + len(hvalue or b"")
    return size


_batch_numbers = itertools.count()


class ProducerBatch:
    """Records for one partition that travel in one v2 batch, with their futures."""

    def __init__(self, tp: TopicPartition, created: float) -> None:
        self.tp = tp
        self.created = created
        # Creation order. Within a partition it is also sequence order (sequences are handed
        # out as batches leave the queue front), and it survives a producer id reset.
        self.number = next(_batch_numbers)
        # The records, column by column (no object per record: a producer may hold many)
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.headers: list[Headers | None] = []
        self.timestamps = array("q")
        self.futures: list[Future] = []
        self.size = HEADER_SIZE
        self.closed = False  # no more appends: full, or drained
        self._init_sending()

    def _init_sending(self) -> None:
        """The state of sending the batch: attempts, the producer id and sequence it is
        sent with, its encoded bytes."""
        self.attempts = 0
        self.retry_at = 0.0
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.base_sequence = NO_SEQUENCE
        self.transactional = False
        self._encoded: bytes | None = None
        self.done = False

    def __repr__(self) -> str:
        return (f"<ProducerBatch {self.tp.topic}-{self.tp.partition} n={self.record_count} "
                f"seq={self.base_sequence} attempts={self.attempts}>")

    @property
    def record_count(self) -> int:
        return len(self.values)

    @property
    def has_sequence(self) -> bool:
        return self.base_sequence != NO_SEQUENCE

    def try_append(self, key: bytes | None, value: bytes | None, headers: Headers | None,
                   timestamp: int, record_size: int, batch_size: int) -> Future | None:
        if self.closed or (self.values and self.size + record_size > batch_size):
            return None
        self.keys.append(key)
        self.values.append(value)
        self.headers.append(headers or None)
        self.timestamps.append(timestamp)
        self.size += record_size
        future = RecordFuture()
        self.futures.append(future)
        if self.size >= batch_size:
            self.closed = True
        return future

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int,
                           transactional: bool = False) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self._encoded = None

    def encode(self, compression: Compression) -> bytes:
        """The wire bytes, built once: a retry must resend exactly what was sent before.
        The records are encoded column-wise by the compiled codec (records/columnar.py),
        byte for byte what records/batch.py's build_batch makes, in a tenth of the time."""
        if self._encoded is None:
            headers = self.headers if any(self.headers) else None
            (section, count, base_ts, max_ts), = encode_sections(
                self.values, self.keys, timestamps=self.timestamps, headers=headers)[0]
            self._encoded = wrap_records(
                section, count, base_ts, max_ts, compression=compression,
                producer_id=self.producer_id, producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence, is_transactional=self.transactional)
        return self._encoded

    def complete(self, base_offset: int, log_append_time: int | None) -> None:
        if self.done:
            return
        self.done = True
        topic, partition = self.tp
        timestamps = self.timestamps if log_append_time is None \
            else [log_append_time] * len(self.futures)
        for i, (future, ts) in enumerate(zip(self.futures, timestamps)):
            offset = base_offset + i if base_offset >= 0 else -1
            future.set_result(RecordMetadata(topic, partition, offset, ts))

    def fail(self, error: BaseException) -> None:
        if self.done:
            return
        self.done = True
        for future in self.futures:
            future.set_exception(error)


class BatchGroup(Protocol):
    """Where the batches of one ``send_batch`` call report (bulk_send.BatchGroup)."""

    def batch_done(self, index: int, result: tuple[int, int]) -> None: ...

    def batch_failed(self, error: BaseException) -> None: ...


class EncodedBatch(ProducerBatch):
    """A batch whose records section was encoded in bulk (records/columnar.py: the
    producer's ``send_batch``): closed from the start, no future per record; it reports
    (partition, base offset), or its failure, to the ``group`` of its call as batch number
    ``index`` of the call."""

    def __init__(self, tp: TopicPartition, created: float, section: bytes, count: int,
                 base_timestamp: int, max_timestamp: int, group: BatchGroup,
                 index: int) -> None:
        # ProducerBatch's state, without its record columns (a batch per 16 KB, at Kafka's
        # batch.size, of a call that sends many: they are made by the thousand)
        self.tp = tp
        self.created = created
        self.number = -1  # given as it is queued
        self.futures = []
        self.size = HEADER_SIZE + len(section)
        self.closed = True
        self._init_sending()
        self.section = section
        self.count = count
        self.base_timestamp = base_timestamp
        self.max_timestamp = max_timestamp
        self.group = group
        self.index = index

    def __repr__(self) -> str:
        return (f"<EncodedBatch {self.tp.topic}-{self.tp.partition} n={self.count} "
                f"seq={self.base_sequence} attempts={self.attempts}>")

    @property
    def record_count(self) -> int:
        return self.count

    def encode(self, compression: Compression) -> bytes:
        if self._encoded is None:
            self._encoded = wrap_records(
                self.section, self.count, self.base_timestamp, self.max_timestamp,
                compression=compression, producer_id=self.producer_id,
                producer_epoch=self.producer_epoch, base_sequence=self.base_sequence,
                is_transactional=self.transactional)
        return self._encoded

    def complete(self, base_offset: int, log_append_time: int | None) -> None:
        if self.done:
            return
        self.done = True
        self.group.batch_done(self.index, (self.tp.partition, base_offset))

    def fail(self, error: BaseException) -> None:
        if self.done:
            return
        self.done = True
        self.group.batch_failed(error)


class RecordAccumulator:
    def __init__(self, *, batch_size: int, linger_ms: int, buffer_memory: int,
                 compression: Compression) -> None:
        self.batch_size = batch_size
        self.linger = linger_ms / 1000
        self.buffer_memory = buffer_memory
        self.compression = compression
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)  # waited on when buffer.memory is used up
        self._settled = threading.Condition(self._lock)  # waited on by flush
        self._queues: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._used = 0
        self._flushes = 0
        self.closing = False
        self.wakeup: Callable[[], None] = lambda: None
        # By when the sender looks at the queues again on its own (``ready`` sets it: it
        # sleeps no longer than the next batch it knows of needs): a new or full batch wakes
        # it only if it is due before then. A wakeup costs the caller's thread a system call
        # and the GIL (the sender takes it), for every 16 KB batch at Kafka's batch.size.
        self._looks_by = float("inf")

    # --- caller's thread --------------------------------------------------------------------

    def append(self, tp: TopicPartition, key: bytes | None, value: bytes | None,
               headers: Headers, timestamp: int, deadline: float,
               abort_on_new_batch: bool = False, size: int | None = None) -> Future | None:
        """Queue one record and return its future.

        With ``abort_on_new_batch``, return None instead of starting a new batch (the sticky
        partitioner then moves on and appends elsewhere: KIP-480). Blocks while buffer.memory
        is used up, until ``deadline`` (then KafkaTimeoutError). ``size``: the record's
        ``estimate_record_size``, if the caller has it.
        """
        if size is None:
            size = estimate_record_size(key, value, headers)
        with self._lock:
            self._wait_for_space(size, deadline)
            queue = self._queues.setdefault(tp, deque())
            batch = queue[-1] if queue else None
            future = None
            created = False
            if batch is not None and not batch.has_sequence:
                future = batch.try_append(key, value, headers, timestamp, size, self.batch_size)
            if future is None:
                if batch is not None and not batch.closed:
                    batch.closed = True  # the record did not fit: this batch is as full as it gets
                if abort_on_new_batch:
                    return None
                batch = ProducerBatch(tp, time.monotonic())
                future = batch.try_append(key, value, headers, timestamp, size, self.batch_size)
                assert future is not None
                queue.append(batch)
                self._incomplete.add(batch)
                created = True
            assert batch is not None
            self._used += size
            wake = False
            if batch.closed or created:
                # A full batch (this one, or the one before a new one) is due now; a new
                # batch alone in its queue when linger.ms has passed.
                now = time.monotonic()
                due = batch.created + self.linger if created and len(queue) == 1 else now
                if due < self._looks_by:
                    self._looks_by = due
                    wake = True
        if wake:
            self.wakeup()
        return future

    def append_encoded(self, batches: Sequence[EncodedBatch], deadline: float) -> None:
        """Queue whole batches (``EncodedBatch``), each behind its partition's queue. Blocks
        while buffer.memory is used up, until ``deadline`` (then KafkaTimeoutError: the
        batches queued before stay queued)."""
        queues = self._queues
        with self._lock:  # (released while waiting for space)
            for batch in batches:
                size = batch.size - HEADER_SIZE
                self._wait_for_space(size, deadline)
                queue = queues.get(batch.tp)
                if queue is None:
                    queue = queues[batch.tp] = deque()
                # Numbered as it is queued: batches of one partition that threads encoded side
                # by side are in number order in their queue (a retry is put back by number).
                batch.number = next(_batch_numbers)
                batch.created = now = time.monotonic()
                queue.append(batch)
                self._incomplete.add(batch)
                self._used += size
                if now < self._looks_by:  # a closed batch: due now
                    self._looks_by = now
                    self.wakeup()  # (takes no lock of ours)

    def _wait_for_space(self, size: int, deadline: float) -> None:
        """With the lock held: block while buffer.memory has no room for ``size`` more bytes
        (something is always let in when nothing is queued), until ``deadline``; refuse once
        the producer is closing."""
        while self._used + size > self.buffer_memory and self._used > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(
                    f"buffer.memory ({self.buffer_memory} bytes) still full after max.block.ms")
            self._space.wait(remaining)
        if self.closing:
            raise RuntimeError("cannot send: the producer is closing")

    def flush_begin(self) -> list[ProducerBatch]:
        """Make every batch ready now; return the incomplete ones to wait for."""
        with self._lock:
            self._flushes += 1
            pending = list(self._incomplete)
        self.wakeup()
        return pending

    def await_settled(self, batches: Sequence[ProducerBatch], deadline: float | None) -> int:
        """Wait until every one of ``batches`` is settled (acknowledged or failed, its
        futures done: the sender releases a batch after completing it), or ``deadline``
        passes; the records of those still unsettled then (0: all settled)."""
        with self._lock:
            for i, batch in enumerate(batches):
                while batch in self._incomplete:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return sum(b.record_count for b in batches[i:]
                                   if b in self._incomplete)
                    self._settled.wait(remaining)
        return 0

    def flush_end(self) -> None:
        with self._lock:
            self._flushes -= 1

    # --- sender thread ----------------------------------------------------------------------

    def ready(self, cluster: Cluster, now: float,
              may_send: Callable[[TopicPartition, ProducerBatch], bool]
              ) -> tuple[set[int], float, set[str]]:
        """(nodes with something to send, seconds until the next batch gets ready, topics
        whose leader is unknown)."""
        nodes: set[int] = set()
        unknown: set[str] = set()
        next_check = 1.0
        with self._lock:
            hurry = self.closing or self._flushes > 0
            for tp, queue in self._queues.items():
                if not queue:
                    continue
                batch = queue[0]
                leader = cluster.leader_for(tp)
                if leader is None:
                    unknown.add(tp.topic)
                    continue
                if batch.retry_at > now:
                    next_check = min(next_check, batch.retry_at - now)
                    continue
                due = batch.created + self.linger
                if batch.closed or len(queue) > 1 or hurry or batch.attempts or due <= now:
                    if may_send(tp, batch):
                        nodes.add(leader)
                else:
                    next_check = min(next_check, due - now)
            next_check = max(0.0, next_check)
            self._looks_by = now + next_check
        return nodes, next_check, unknown

    def drain(self, cluster: Cluster, nodes: Iterable[int], max_request_size: int, now: float,
              may_send: Callable[[TopicPartition, ProducerBatch], bool],
              assign: Callable[[ProducerBatch], None]) -> dict[int, list[ProducerBatch]]:
        """At most one batch per partition per node, up to max.request.size per request."""
        out: dict[int, list[ProducerBatch]] = {}
        wanted = set(nodes)
        with self._lock:
            sizes: dict[int, int] = {}
            for tp, queue in self._queues.items():
                if not queue:
                    continue
                leader = cluster.leader_for(tp)
                if leader not in wanted:
                    continue
                batch = queue[0]
                if batch.retry_at > now or not may_send(tp, batch):
                    continue
                size = len(batch.encode(self.compression)) if batch.has_sequence else batch.size
                if out.get(leader) and sizes[leader] + size > max_request_size:
                    continue
                queue.popleft()
                batch.closed = True
                assign(batch)
                sizes[leader] = sizes.get(leader, 0) + len(batch.encode(self.compression))
                out.setdefault(leader, []).append(batch)
        return out

    def reenqueue(self, batch: ProducerBatch, retry_at: float) -> None:
        """Put a batch back for retry: at the front, in creation (= sequence) order."""
        batch.retry_at = retry_at
        with self._lock:
            queue = self._queues.setdefault(batch.tp, deque())
            i = 0
            while i < len(queue) and queue[i].number < batch.number:
                i += 1
            queue.insert(i, batch)

    def expired(self, now: float, delivery_timeout: float) -> list[ProducerBatch]:
        """Remove and return queued batches older than delivery.timeout.ms."""
        out = []
        with self._lock:
            for queue in self._queues.values():
                # A queue is in creation order (``number`` and ``created`` are both set under
                # the lock when a batch is queued, and a retry goes back in number order), so
                # its front is its oldest batch: stop at the first one with time left, as the
                # Java client's expiredBatches does, instead of looking at every batch.
                while queue and now - queue[0].created >= delivery_timeout:
                    out.append(queue.popleft())
        return out

    def release(self, batch: ProducerBatch) -> None:
        """A batch is settled (acknowledged or failed, after its futures were completed, as
        the Java sender deallocates a batch after its callbacks): free its memory."""
        with self._lock:
            if batch in self._incomplete:
                self._incomplete.discard(batch)
                self._used -= batch.size - HEADER_SIZE
                self._space.notify_all()
                self._settled.notify_all()

    def queued_batches(self) -> list[ProducerBatch]:
        with self._lock:
            return [b for q in self._queues.values() for b in q]

    def take_all(self) -> list[ProducerBatch]:
        with self._lock:
            out = [b for q in self._queues.values() for b in q]
            self._queues.clear()
            return out

    def has_queued(self) -> bool:
        with self._lock:
            return any(self._queues.values())

    def has_incomplete(self) -> bool:
        with self._lock:
            return bool(self._incomplete)

    def take_incomplete(self) -> list[ProducerBatch]:
        """Every batch not yet settled, queued or in flight (for a forced close)."""
        with self._lock:
            batches = list(self._incomplete)
            self._queues.clear()
        return batches

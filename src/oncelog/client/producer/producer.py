"""The Producer users import: ``send`` returns a future, a background thread does the IO.

    with Producer(bootstrap_servers="127.0.0.1:9092") as producer:
        producer.send("events", b"value", key=b"key").result()

Idempotent by default, as the Java client since Kafka 3.0: acks=all, a producer id from
InitProducerId, sequence numbers on every batch (see sender.py).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Self

from ...errors import (
    FatalError,
    KafkaError,
    MessageTooLargeError,
    RetriableError,
    UnknownTopicOrPartitionError,
)
from ...records.batch import HEADER_SIZE
from ...records.columnar import (
    column_arg,
    column_rows,
    encode_sections,
    headers_arg,
    int64_column,
)
from .. import retries, serde
from ..config import producer_config
from ..errors import IllegalStateError, KafkaTimeoutError, TransactionError
from ..network import NetworkClient
from ..types import ConsumerGroupMetadata, RecordMetadata, TopicPartition
from .accumulator import EncodedBatch, RecordAccumulator, estimate_record_size
from .bulk_send import BatchGroup, route_rows
from .partitioner import StickyPartitioner, partition_for_key
from .sender import Sender
from .transaction_manager import PreparedTxnState, TransactionManager

log = logging.getLogger(__name__)

_client_ids = itertools.count(1)

HeadersArg = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]] | None


def _to_bytes(data: bytes | bytearray | memoryview | str | None, what: str) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"{what} must be bytes or str, not {type(data).__name__}")


def _headers(headers: HeadersArg) -> Sequence[tuple[str, bytes | None]]:
    if headers is None:
        return ()  # (not a new list per record: the producer holds its records a while)
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for hkey, hvalue in items:
        if not isinstance(hkey, str):
            raise TypeError(f"header keys must be str, not {type(hkey).__name__}")
        out.append((hkey, _to_bytes(hvalue, "header value")))
    return out


DeliveryCallback = Callable[[BaseException | None, RecordMetadata | None], Any]


def _delivery_callback(callback: DeliveryCallback) -> Callable[[Future], None]:
    def done(future: Future) -> None:
        error = future.exception()
        try:
            callback(error, None if error is not None else future.result())
        except Exception:
            log.exception("on_delivery callback %r raised", callback)

    return done


def _failed(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


class Producer:
    """Send records to topics. Thread-safe: share one producer between threads.

    Configuration: Kafka's producer config names, as a dict (``Producer({"linger.ms": 10})``)
    and/or keyword arguments with underscores (``Producer(linger_ms=10)``).
    """

    def __init__(self, config: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        config, (self._key_serializer, self._value_serializer) = serde.take(
            config, kwargs, ("key_serializer", "value_serializer"))
        self.config = producer_config(config, kwargs)
        client_id = self.config.client_id or f"oncelog-producer-{next(_client_ids)}"
        self.client_id = client_id
        self._accumulator = RecordAccumulator(
            batch_size=self.config.batch_size, linger_ms=self.config.linger_ms,
            buffer_memory=self.config.buffer_memory, compression=self.config.compression_type)
        self._sender = Sender(self.config, self._accumulator, NetworkClient(self.config,
                                                                            client_id))
        self._partitioner = StickyPartitioner()
        self._closed = False
        self._txn: TransactionManager | None = None
        if self.config.transactional_id is not None:
            # State the sender drives: it sends the manager's coordinator requests on its
            # own network client (no second client, no blocking loop of the manager's).
            self._txn = TransactionManager(self.config, self._sender.set_producer_id,
                                           self.flush, self._sender.set_transaction_v2,
                                           self._sender.net.wakeup)
            self._sender.transaction_manager = self._txn
            self._sender.on_sequence_lost = self._txn.sequence_lost
        self._sender.start()

    # --- transactions (spec 000, "Transactional Producer") ----------------------------------

    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise IllegalStateError("transactional.id is not set: this producer has no "
                                    "transactions")
        return self._txn

    def init_transactions(self, timeout: float | None = None,
                          keep_prepared_txn: bool = False) -> None:
        """Register the transactional id with its coordinator: fences any earlier producer with
        the same id and aborts (or completes) its unfinished transaction. Call once, first.

        ``keep_prepared_txn`` (two-phase commit, KIP-939): keep the unfinished transaction
        instead, prepared; then only commit_transaction, abort_transaction or
        complete_transaction may follow."""
        self._transactions().init_transactions(timeout, keep_prepared_txn)

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTxnState:
        """Two-phase commit, phase one (KIP-939; needs
        ``transaction_two_phase_commit_enable=True``): flush the transaction and return its
        PreparedTxnState (``str()`` it into your database). The transaction stays open, never
        times out, and takes no more records: commit, abort or complete it."""
        return self._transactions().prepare(timeout)

    def complete_transaction(self, prepared_txn_state: PreparedTxnState,
                             timeout: float | None = None) -> None:
        """Two-phase commit recovery: commit the prepared transaction if it is the one
        ``prepared_txn_state`` names (as your database recorded it), abort it otherwise."""
        self._transactions().complete(prepared_txn_state, timeout)

    def begin_transaction(self) -> None:
        """Start a transaction: the records sent until commit_transaction or abort_transaction
        belong to it. Needs init_transactions first; one transaction at a time."""
        self._transactions().begin_transaction()

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int] | Any,
                                    group_metadata: ConsumerGroupMetadata | str,
                                    timeout: float | None = None) -> None:
        """Commit consumed offsets (the NEXT offset to read, per partition) as part of the
        transaction: they become the group's committed offsets only if it commits. Pass the
        consumer's ``group_metadata()`` so that a zombie instance is fenced (KIP-447)."""
        self._transactions().send_offsets(offsets, group_metadata, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit. Raises TransactionError (abortable: call abort_transaction)
        if any record of the transaction failed, or a FatalError if this producer was
        fenced."""
        self._transactions().commit(timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: read_committed consumers never see its records."""
        self._transactions().abort(timeout)

    # --- sending ----------------------------------------------------------------------------

    def send(self, topic: str, value: Any = None, key: Any = None,
             partition: int | None = None, headers: HeadersArg = None,
             timestamp_ms: int | None = None,
             on_delivery: DeliveryCallback | None = None) -> Future[RecordMetadata]:
        """Queue a record; the future resolves to its RecordMetadata once acknowledged.

        ``key`` and ``value`` are bytes or str, or anything the producer's ``key_serializer``
        / ``value_serializer`` turn into those (client/serde.py). ``on_delivery``: called once
        the record is settled as confluent-kafka's callback is, ``on_delivery(err, metadata)``
        (err None and the RecordMetadata, or the exception and None), but on the producer's
        I/O thread as Java's send callback (keep it short; what it raises is logged), or at
        once on the caller's thread when the send failed before the record was queued.

        Blocks only while the topic's metadata is unknown or buffer.memory is full, for at
        most max.block.ms; then the returned future fails (as the Java client's does). A
        future fails with the oncelog.errors class of the broker's error, or KafkaTimeoutError
        when delivery.timeout.ms passes first.

        Inside a transaction, a record that fails here (raised or a failed future: unknown
        partition, too large, no metadata in time, not bytes) fails the transaction:
        commit_transaction and prepare_transaction raise TransactionError, abort_transaction
        recovers. A fatal error (fenced, unauthorized) stays fatal.
        """
        if self._closed:
            raise RuntimeError("cannot send: the producer is closed")
        if self._key_serializer is not None or self._value_serializer is not None:
            try:
                key = serde.apply(self._key_serializer, topic, key, "key_serializer",
                                  "serialize")
                value = serde.apply(self._value_serializer, topic, value, "value_serializer",
                                    "serialize")
            except KafkaError as exc:
                if self._txn is not None:
                    self._txn.send_failed(exc)
                raise
        if on_delivery is not None:
            future = self._send_checked(topic, value, key, partition, headers, timestamp_ms)
            future.add_done_callback(_delivery_callback(on_delivery))
            return future
        return self._send_checked(topic, value, key, partition, headers, timestamp_ms)

    def _send_checked(self, topic: str, value: Any, key: Any, partition: int | None,
                      headers: HeadersArg, timestamp_ms: int | None) -> Future[RecordMetadata]:
        txn = self._txn
        if txn is None:
            return self._send(topic, value, key, partition, headers, timestamp_ms)
        txn.check_can_send()  # raises outside a transaction, as the Java client
        # A record that fails, by a raise or a failed future, fails its transaction: commit
        # and prepare raise, abort recovers (KafkaProducer.doSend ->
        # maybeTransitionToErrorState). BaseException: an interrupted send may have lost it.
        try:
            future = self._send(topic, value, key, partition, headers, timestamp_ms)
        except BaseException as exc:
            txn.send_failed(exc)
            raise
        error = future.exception() if future.done() else None
        if error is not None:
            txn.send_failed(error)
        else:
            txn.track(future)
        return future

    def _send(self, topic: str, value: bytes | str | None, key: bytes | str | None,
              partition: int | None, headers: HeadersArg,
              timestamp_ms: int | None) -> Future[RecordMetadata]:
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        key_bytes = key if key is None or type(key) is bytes else _to_bytes(key, "key")
        value_bytes = value if value is None or type(value) is bytes \
            else _to_bytes(value, "value")
        record_headers = _headers(headers)
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        if self._sender.fatal_error is not None:
            return _failed(self._sender.fatal_error)
        size = estimate_record_size(key_bytes, value_bytes, record_headers)
        if size > self.config.max_request_size:
            return _failed(MessageTooLargeError(
                f"the record is {size} bytes, more than max.request.size "
                f"({self.config.max_request_size})"))
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        try:
            partitions = self._wait_for_partitions(topic, deadline)
            sticky = partition is None and key_bytes is None
            if partition is None:
                if key_bytes is not None:
                    partition = partitions[partition_for_key(key_bytes, len(partitions))]
                else:
                    partition = self._partitioner.partition(topic, partitions)
            elif partition not in partitions:
                raise UnknownTopicOrPartitionError(
                    f"partition {partition} of topic {topic!r} does not exist "
                    f"(it has {len(partitions)})")
            if self._txn is not None:
                self._txn.add_partition(TopicPartition(topic, partition), deadline)
            append = self._accumulator.append
            future = append(TopicPartition(topic, partition), key_bytes, value_bytes,
                            record_headers, timestamp_ms, deadline, abort_on_new_batch=sticky,
                            size=size)
            if future is None:
                # The sticky partition's batch is full: stick to another partition from now on
                # (KIP-480), and start the next batch there.
                self._partitioner.batch_full(topic, partition, partitions)
                partition = self._partitioner.partition(topic, partitions)
                if self._txn is not None:
                    self._txn.add_partition(TopicPartition(topic, partition), deadline)
                future = append(TopicPartition(topic, partition), key_bytes, value_bytes,
                                record_headers, timestamp_ms, deadline, size=size)
        except KafkaError as exc:
            if self._txn is not None and isinstance(exc, FatalError | TransactionError):
                raise  # the transaction manager's own failure: it is in its error state
            return _failed(exc)
        assert future is not None
        return future

    def send_batch(self, topic: str, values: Any, keys: Any = None, *, partition: Any = None,
                   timestamps: Any = None, headers: Any = None
                   ) -> Future[list[tuple[int, int]]]:
        """Queue many records at once, encoded column-wise in C (records/columnar.py); the
        future resolves once every one is acknowledged, to a list of (partition, base offset)
        of the batches they went in, partition by partition in ascending order and within a
        partition in the order of ``values``; it fails with the first failure of any.

        ``values``, ``keys``: a list of bytes / str / None, or a pyarrow Binary, LargeBinary,
        String or LargeString array (a slice, nulls and a ChunkedArray are fine).
        ``partition``: None (a keyed row goes where ``send`` would put its key, Kafka's
        murmur2 partitioner; the unkeyed rows all go to one sticky partition), one
        partition for every row, or one per row (a sequence or an Arrow integer array).
        ``timestamps``: None (now), one int for every row, or one per row (ms; a sequence or
        an Arrow int64/timestamp array). ``headers``: None, per row None or a sequence of
        (str, bytes | None) pairs, or a pyarrow list<struct<key: string, value: binary>> array
        (Spark's Kafka ``headers`` column).

        The records are encoded into batches of at most batch.size bytes (a record larger
        than that gets a batch of its own) that the sender sends as it sends ``send``'s:
        idempotence, transactions, compression, retries and ``flush`` apply alike. Before
        anything is queued, an unknown topic, a partition the topic does not have or a
        record larger than max.request.size (with its batch's header) fail the returned
        future, and nothing of the call is sent. A column of a wrong type or length raises
        TypeError or ValueError at once. Blocks only as ``send`` does (metadata,
        buffer.memory); if buffer.memory stays full past max.block.ms, the future fails with
        KafkaTimeoutError and the batches queued before it are still sent.

        Inside a transaction, a failure fails the transaction, as for ``send``; all the
        partitions of the call join it in one AddPartitionsToTxn.
        """
        if self._closed:
            raise RuntimeError("cannot send: the producer is closed")
        txn = self._txn
        if txn is not None:
            txn.check_can_send()
        try:
            future, queued = self._send_batch(topic, values, keys, partition, timestamps,
                                              headers)
        except BaseException as exc:
            if txn is not None:
                txn.send_failed(exc)
            raise
        if txn is not None:
            error = future.exception() if future.done() else None
            if error is not None:
                txn.send_failed(error)
            elif queued:
                txn.track(future)
        return future

    def _send_batch(self, topic: str, values: Any, keys: Any, partition: Any, timestamps: Any,
                    headers: Any) -> tuple[Future[list[tuple[int, int]]], bool]:
        """The call's future, and whether its batches were queued."""
        if not isinstance(topic, str) or not topic:
            raise TypeError("topic must be a non-empty str")
        if values is None:
            raise TypeError("values: a list or an Arrow array (use [None] * n for tombstones)")
        value_col = column_arg(values, "values")
        rows = column_rows(value_col)
        key_col = column_arg(keys, "keys")
        if key_col is not None and column_rows(key_col) != rows:
            raise ValueError(f"keys: {column_rows(key_col)} rows, the values have {rows}")
        header_rows = headers_arg(headers)
        if header_rows is not None and column_rows(header_rows) != rows:
            raise ValueError(f"headers: {column_rows(header_rows)} rows, the values have "
                             f"{rows}")
        now = int(time.time() * 1000)
        ts = None
        if isinstance(timestamps, int):
            now = timestamps
        else:
            ts = int64_column(timestamps, rows, "timestamps")
        if self._sender.fatal_error is not None:
            return _failed(self._sender.fatal_error), False
        deadline = time.monotonic() + self.config.max_block_ms / 1000
        try:
            partitions = self._wait_for_partitions(topic, deadline)
            groups, sticky = route_rows(topic, partitions, partition, key_col, rows,
                                        lambda: self._partitioner.partition(topic, partitions))
            max_bytes = self.config.batch_size - HEADER_SIZE
            sticky_bytes = 0
            encoded: list[tuple[TopicPartition, list[tuple[bytes, int, int, int]]]] = []
            for p, order, start, stop in groups:
                chunks, largest = encode_sections(
                    value_col, key_col, timestamps=ts, default_timestamp=now,
                    headers=header_rows, indices=order, start=start, stop=stop,
                    max_bytes=max_bytes)
                if largest + HEADER_SIZE > self.config.max_request_size:
                    raise MessageTooLargeError(
                        f"a record is {largest + HEADER_SIZE} bytes with its batch's header, "
                        f"more than max.request.size ({self.config.max_request_size})")
                encoded.append((TopicPartition(topic, p), chunks))
                if p == sticky:
                    sticky_bytes += sum(len(c[0]) + HEADER_SIZE for c in chunks)
            group = BatchGroup(sum(len(chunks) for _, chunks in encoded))
            created = time.monotonic()
            batches = [EncodedBatch(tp, created, *chunk, group, i) for i, (tp, chunk) in
                       enumerate((tp, chunk) for tp, chunks in encoded for chunk in chunks)]
            if self._txn is not None:
                self._txn.add_partitions({tp for tp, _ in encoded}, deadline)
            self._accumulator.append_encoded(batches, deadline)
            if sticky is not None and sticky_bytes >= self.config.batch_size:
                # The sticky partition got a batch's worth: the next unkeyed records go to
                # another one (KIP-480, as ``send`` moves on when its batch is full).
                self._partitioner.batch_full(topic, sticky, partitions)
        except KafkaError as exc:
            if self._txn is not None and isinstance(exc, FatalError | TransactionError):
                raise  # the transaction manager's own failure: it is in its error state
            return _failed(exc), False
        return group.future, True

    def _wait_for_partitions(self, topic: str, deadline: float) -> list[int]:
        sender = self._sender
        partitions = sender.net.cluster.partitions_for(topic)
        if partitions is not None and topic in sender.topics:
            return partitions
        sender.request_metadata(topic)
        last_noted: KafkaError | None = None
        attempt = 1
        with sender.metadata_changed:
            while True:
                partitions = sender.net.cluster.partitions_for(topic)
                if partitions is not None:
                    return partitions
                code = sender.net.cluster.topic_error(topic)
                error = sender.last_metadata_error
                if code and error is not None and not isinstance(error, RetriableError):
                    raise error  # e.g. INVALID_TOPIC_EXCEPTION: waiting will not help
                if sender.fatal_error is not None:
                    raise sender.fatal_error
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if error is not None and error is not last_noted:
                    # a metadata answer without the topic: say what send() waits for
                    last_noted, attempt = error, attempt + 1
                    retries.note("METADATA", error, attempt, remaining)
                sender.metadata_changed.wait(remaining)
        sender.forget_topic(topic)
        waited = self.config.max_block_ms
        if code:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} not present in metadata after {waited} ms")
        raise KafkaTimeoutError(f"topic {topic!r} not present in metadata after {waited} ms"
                                + (f" (last error: {error})" if error else "")
                                + sender.net.connection_error_note())

    def partitions_for(self, topic: str) -> list[int]:
        """The topic's partition ids (fetching metadata if needed, up to max.block.ms)."""
        return self._wait_for_partitions(topic, time.monotonic() + self.config.max_block_ms / 1000)

    def list_topics(self, timeout: float | None = None) -> list[str]:
        """Names of the cluster's topics, sorted, internal ones left out (as our
        ``Admin.list_topics`` and kafka-python's ``KafkaAdminClient.list_topics``), asked on a
        connection of the caller's own (the producer's are its I/O thread's); within
        ``timeout`` seconds (max.block.ms) or KafkaTimeoutError."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        wait = self.config.max_block_ms / 1000 if timeout is None else timeout
        net = NetworkClient(self.config, self.client_id)
        try:
            cluster = net.update_metadata(None, time.monotonic() + wait,
                                          allow_auto_topic_creation=False)
        finally:
            net.close()
        return sorted(name for name, meta in cluster.topics.items()
                      if not meta.error_code and not meta.is_internal)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now (ignoring linger.ms) and wait until it is settled.

        Raises KafkaTimeoutError if ``timeout`` seconds pass first. Failed records do not raise
        here; their futures carry the errors.
        """
        pending = self._accumulator.flush_begin()
        try:
            left = self._accumulator.await_settled(
                pending, None if timeout is None else time.monotonic() + timeout)
            if left:
                raise KafkaTimeoutError(
                    f"flush: {left} record(s) still unacknowledged after {timeout} s")
        finally:
            self._accumulator.flush_end()

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued, wait for it (up to ``timeout`` seconds), then stop.

        Records still unacknowledged when the timeout passes fail with a KafkaError.
        """
        if self._closed:
            return
        self._closed = True
        if self._txn is not None:
            self._txn.close()
        self._sender.initiate_close()
        if not self._sender.join(timeout):
            log.warning("producer %s: closing forcefully after %s s", self.client_id, timeout)
            self._sender.force_close()
            self._sender.join(None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        # An unclosed producer must not leave its sender thread running. (getattr: __init__
        # may have failed before the sender existed, on a config error.)
        if not getattr(self, "_closed", True):
            self._sender.force_close()

"""The producer's network loop, on its own thread (aiokafka's sender, the Java Sender).

Each turn: get a producer id if idempotent, refresh metadata when asked or stale, send the
transaction manager's next coordinator request (transactional producers: the manager is state,
this thread its IO), drain ready batches into one ProduceRequest per leader, expire batches
past delivery.timeout.ms, wait for responses, and settle each batch: acknowledged, retried, or
failed.

Idempotence (spec 000, "PID-Sequence Management"). A batch gets its base sequence the first time
it is drained and keeps it for every retry. Per partition we track the next sequence to hand out
and the next sequence the broker expects (the end of the last acknowledged batch). Up to
max.in.flight.requests.per.connection (<= 5, the broker's dedup window) requests may be in
flight per connection. When a batch fails with a retriable error, the batches sent after it fail
too (OUT_OF_ORDER_SEQUENCE_NUMBER, because of the gap) and are retried as well; a retried batch
is only sent once nothing else of its partition is in flight, and retries go out in sequence
order, so the broker sees the sequences in order again. DUPLICATE_SEQUENCE_NUMBER means the
broker already has the batch: success.

When a sequenced batch fails for good (non-retriable error, or delivery timeout), the broker
would never see its sequence, and every later batch would be out of order. Then, as the Java
client does for idempotent producers (KIP-360), we wait for the in-flight requests to finish,
take a new producer id, and restart every partition's sequences at 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from ...errors import (
    DuplicateSequenceNumberError,
    InvalidProducerEpochError,
    KafkaError,
    NetworkError,
    OutOfOrderSequenceNumberError,
    RequestTimedOutError,
    RetriableError,
    UnknownProducerIdError,
    error_for_code,
)
from ...protocol import ApiKey, millis
from ...records.batch import increment_sequence
from ..config import ClientConfig
from ..connection import InFlightRequest
from ..coordinator_request import BrokerVersions
from ..errors import KafkaTimeoutError
from ..metadata import metadata_request
from ..network import NetworkClient
from ..types import TopicPartition
from .accumulator import ProducerBatch, RecordAccumulator
from .produce_request import produce_body
from .transaction_manager import TransactionManager

log = logging.getLogger(__name__)

# Errors after which our view of the partition's leader is probably wrong.
_METADATA_ERRORS = {3, 5, 6, 74, 75}  # UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE,
#                                        NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH
_DUPLICATE_SEQUENCE = DuplicateSequenceNumberError.code
_SEQUENCE_LOST = (OutOfOrderSequenceNumberError, UnknownProducerIdError, InvalidProducerEpochError)


class _PartitionState:
    """Sequence bookkeeping for one partition (idempotent producer only)."""

    __slots__ = ("expected_sequence", "in_flight", "next_sequence")

    def __init__(self) -> None:
        self.next_sequence = 0  # handed to the next new batch
        self.expected_sequence = 0  # what the broker will accept next: end of the last ack
        self.in_flight: deque[ProducerBatch] = deque()


class Sender:
    def __init__(self, config: ClientConfig, accumulator: RecordAccumulator,
                 network: NetworkClient) -> None:
        self.config = config
        self.acc = accumulator
        self.net = network
        self.idempotent: bool = config.enable_idempotence
        # Transactional: the TransactionManager's coordinator requests go out from here, one
        # at a time (_maybe_send_transactional_request); it sets the producer id
        # (set_producer_id) and is told when a sequence is lost (on_sequence_lost): that
        # aborts the transaction.
        self.transactional: bool = config.transactional_id is not None
        self.transaction_manager: TransactionManager | None = None
        self.on_sequence_lost: Any = None
        self._txn_request: InFlightRequest | None = None
        self.acks: int = config.acks
        self.max_in_flight: int = config.max_in_flight_requests_per_connection
        self.delivery_timeout = config.delivery_timeout_ms / 1000
        self.producer_id = -1
        self.producer_epoch = -1
        # Produce v12+ means KIP-890 transaction version 2 (the leader adds the partition to
        # the transaction): only when the transaction manager uses that protocol.
        self.produce_max_version: int | None = 11
        self.fatal_error: KafkaError | None = None
        self._partitions: dict[TopicPartition, _PartitionState] = {}
        self._reset_producer_id = False
        self._pid_request: InFlightRequest | None = None
        self._pid_retry_at = 0.0
        self._pid_attempts = 0

        # Metadata: the topics the producer uses, and waiters in send() for a topic to appear.
        self.metadata_changed = threading.Condition()
        self.topics: set[str] = set()
        self._metadata_request: InFlightRequest | None = None
        self._metadata_due = 0.0  # refresh at this monotonic time (0: as soon as possible)
        self._metadata_attempts = 0
        self._metadata_error: KafkaError | None = None

        self._running = True
        self._force_close = False
        self._thread = threading.Thread(target=self._run, name="oncelog-producer-sender",
                                        daemon=True)
        self.acc.wakeup = self.net.wakeup

    # --- control from the caller's threads ---------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def request_metadata(self, topic: str) -> None:
        with self.metadata_changed:
            self.topics.add(topic)
            self._metadata_due = 0.0
        self.net.wakeup()

    def forget_topic(self, topic: str) -> None:
        """send() gave up waiting for ``topic``: stop asking the broker about it."""
        with self.metadata_changed:
            self.topics.discard(topic)

    @property
    def last_metadata_error(self) -> KafkaError | None:
        return self._metadata_error

    def initiate_close(self) -> None:
        """Stop taking records; send what is queued (ignoring linger.ms), then stop."""
        self.acc.closing = True
        self._running = False
        self.net.wakeup()

    def force_close(self) -> None:
        self.acc.closing = True
        self._running = False
        self._force_close = True
        self.net.wakeup()

    def join(self, timeout: float | None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._running:
                self._run_once()
            # Closing: keep going until everything queued and in flight is settled.
            while not self._force_close and (self.acc.has_incomplete()
                                             or self.net.in_flight_total()):
                if self.fatal_error is not None:
                    break
                self._run_once()
        except Exception as exc:  # a bug: do not leave futures hanging forever
            log.exception("producer sender thread failed")
            self.fatal_error = KafkaError(f"producer sender thread failed: {exc!r}")
        finally:
            error = self.fatal_error or KafkaError("the producer was closed before the record "
                                                   "was acknowledged")
            for batch in self._in_flight_batches() + self.acc.take_all():
                self._fail(batch, error, reset=False)
            for batch in self.acc.take_incomplete():
                self._fail(batch, error, reset=False)
            self.net.close()
            with self.metadata_changed:
                self.metadata_changed.notify_all()

    def _run_once(self) -> None:
        now = time.monotonic()
        timeout = 1.0
        if self.fatal_error is not None:
            for batch in self.acc.take_all():
                self._fail(batch, self.fatal_error, reset=False)
        timeout = min(timeout, self._maybe_update_metadata(now))
        if self.transaction_manager is not None:
            timeout = min(timeout, self._maybe_send_transactional_request(now))
        if self.idempotent:
            timeout = min(timeout, self._maybe_init_producer_id(now))
        if not self.idempotent or self.producer_id >= 0:
            timeout = min(timeout, self._send_produce_requests(now))
        # Sending may have found a leader unreachable and asked for metadata (_need_metadata):
        # wake up for it instead of sleeping out the timeout computed before.
        timeout = min(timeout, max(0.0, self._metadata_due - time.monotonic()))
        for batch in self.acc.expired(now, self.delivery_timeout):
            self._fail(batch, self._expiry_error(batch), reset=True)
        for req in self.net.poll(timeout):
            self._handle(req)

    def _in_flight_batches(self) -> list[ProducerBatch]:
        out: list[ProducerBatch] = []
        for state in self._partitions.values():
            out.extend(state.in_flight)
            state.in_flight.clear()
        return out

    def _state(self, tp: TopicPartition) -> _PartitionState:
        state = self._partitions.get(tp)
        if state is None:
            state = self._partitions[tp] = _PartitionState()
        return state

    # --- metadata ---------------------------------------------------------------------------

    def _maybe_update_metadata(self, now: float) -> float:
        if self._metadata_request is not None:
            return 1.0
        if now - self.net.last_metadata_at >= self.config.metadata_max_age_ms / 1000:
            self._metadata_due = min(self._metadata_due, now)
        if self._metadata_due > now:
            return self._metadata_due - now
        with self.metadata_changed:
            topics = sorted(self.topics)
        if not topics:
            self._metadata_due = float("inf")
            return 1.0
        node = self.net.least_loaded_node()
        req = None
        if node is not None:
            try:
                req = self.net.send(node, ApiKey.METADATA, metadata_request(topics),
                                    context=topics)
            except KafkaError as exc:
                self._metadata_error = exc
        if req is None:
            self._metadata_failed(now, self._metadata_error)
            return self._metadata_due - now
        self._metadata_request = req
        self._metadata_due = float("inf")
        return 1.0

    def _metadata_failed(self, now: float, error: KafkaError | None) -> None:
        self._metadata_attempts += 1
        self._metadata_due = now + self._backoff(self._metadata_attempts)
        if error is not None:
            self._metadata_error = error

    def _handle_metadata(self, req: InFlightRequest) -> None:
        self._metadata_request = None
        now = time.monotonic()
        if req.error is not None:
            self._metadata_failed(now, req.error)
            return
        self.net.apply_metadata(req.response, req.context)
        self._metadata_error = None
        cluster = self.net.cluster
        # A topic being created (LEADER_NOT_AVAILABLE), not there yet, or a partition without
        # leader: look again soon.
        again = False
        for topic in req.context:
            meta = cluster.topics.get(topic)
            if meta is None or meta.error_code or any(p.leader < 0
                                                      for p in meta.partitions.values()):
                again = True
                if meta is not None and meta.error_code:
                    self._metadata_error = error_for_code(meta.error_code)(
                        f"topic {topic!r}: metadata error")
        if again:
            self._metadata_attempts += 1
            self._metadata_due = now + self._backoff(self._metadata_attempts)
        else:
            self._metadata_attempts = 0
            self._metadata_due = float("inf")
        with self.metadata_changed:
            self.metadata_changed.notify_all()

    def _need_metadata(self) -> None:
        if self._metadata_request is None:
            self._metadata_due = min(self._metadata_due,
                                     time.monotonic() + self._backoff(1))

    def _backoff(self, attempts: int) -> float:
        """The wait before retry number ``attempts`` (1 for the first)."""
        return self.net.retry_backoff.backoff(attempts - 1)

    # --- the transaction manager's requests -------------------------------------------------

    def _maybe_send_transactional_request(self, now: float) -> float:
        """Send the transaction manager's next coordinator request, if one is due and none is
        in flight; how long until one may be due."""
        txn = self.transaction_manager
        if txn is None or self._txn_request is not None:
            return 1.0
        while True:
            step = txn.next_request(now)
            if step is None:
                return 1.0
            if isinstance(step, float):
                return step
            node = step.node if step.node is not None else self.net.least_loaded_node()
            if node is not None and step.address is not None:
                self.net.learn_address(node, *step.address)
            try:
                conn = self.net.connection(node) if node is not None else None
            except KafkaError as exc:  # e.g. authentication failed: the call fails with it
                txn.on_failure(step, exc, now)
                continue
            if conn is None or node is None:
                txn.on_failure(step, self.net.unreachable(node) if node is not None else
                               NetworkError("no node is reachable"), now)
                continue
            values = txn.request_values(step, BrokerVersions(conn.api_versions, conn.features))
            if values is None:
                continue  # the handler failed the call
            try:
                req = self.net.send(node, step.api, values, context=step,
                                    timeout_ms=step.timeout_ms, max_version=step.max_version)
            except KafkaError as exc:  # no usable version: nothing was sent
                txn.on_failure(step, exc, now)
                continue
            if req is None:
                txn.on_failure(step, self.net.unreachable(node), now)
                continue
            self._txn_request = req
            return 1.0

    def _handle_transactional(self, req: InFlightRequest) -> None:
        self._txn_request = None
        txn = self.transaction_manager
        assert txn is not None
        if req.error is not None:
            txn.on_failure(req.context, req.error, time.monotonic())
        else:
            txn.on_response(req.context, req.response, time.monotonic())

    # --- producer id ------------------------------------------------------------------------

    def set_transaction_v2(self, on: bool) -> None:
        """KIP-890: Produce v12+ only for a transaction manager that uses transaction
        version 2 (the partition leader then adds the partition itself)."""
        self.produce_max_version = None if on else 11

    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """The transaction manager's producer id and epoch (nothing is in flight when it is
        called): every partition's sequences restart at 0."""
        self._partitions.clear()
        self.producer_epoch = producer_epoch
        self.producer_id = producer_id

    def _maybe_init_producer_id(self, now: float) -> float:
        if self.transactional:
            return 1.0  # the transaction manager gets the producer id
        if self._reset_producer_id and self.net.in_flight_total() == 0 \
                and self._metadata_request is None and self._pid_request is None:
            self._do_reset_producer_id()
        if self.producer_id >= 0 or self._pid_request is not None:
            return 1.0
        if self._pid_retry_at > now:
            return self._pid_retry_at - now
        node = self.net.least_loaded_node()
        req = None
        if node is not None:
            try:
                # No transactional id: the broker hands out a fresh producer id, epoch 0.
                req = self.net.send(node, ApiKey.INIT_PRODUCER_ID, {
                    "transactional_id": None, "transaction_timeout": 60000,
                    "producer_id": -1, "producer_epoch": -1})
            except KafkaError as exc:
                if not isinstance(exc, RetriableError):
                    self.fatal_error = exc
                    return 0.0
        if req is None:
            self._pid_attempts += 1
            self._pid_retry_at = now + self._backoff(self._pid_attempts)
            return self._pid_retry_at - now
        self._pid_request = req
        return 1.0

    def _handle_init_producer_id(self, req: InFlightRequest) -> None:
        self._pid_request = None
        error: KafkaError | None = req.error
        if error is None and req.response.error_code:
            error = error_for_code(int(req.response.error_code))("InitProducerId")
        if error is None:
            self.producer_id = int(req.response.producer_id)
            self.producer_epoch = int(req.response.producer_epoch)
            self._pid_attempts = 0
            log.debug("producer id %d epoch %d", self.producer_id, self.producer_epoch)
            return
        if isinstance(error, RetriableError):
            self._pid_attempts += 1
            self._pid_retry_at = time.monotonic() + self._backoff(self._pid_attempts)
        else:
            self.fatal_error = error

    def _do_reset_producer_id(self) -> None:
        """New producer id; sequences restart at 0 and queued batches are renumbered."""
        log.info("resetting producer id %d after a lost sequence", self.producer_id)
        self._reset_producer_id = False
        self.producer_id = -1
        self.producer_epoch = -1
        self._partitions.clear()
        for batch in self.acc.queued_batches():
            batch.set_producer_state(-1, -1, -1)

    # --- produce ----------------------------------------------------------------------------

    def _may_send(self, tp: TopicPartition, batch: ProducerBatch) -> bool:
        if self._reset_producer_id:
            return False  # hold everything until the new producer id
        state = self._partitions.get(tp)
        in_flight = len(state.in_flight) if state is not None else 0
        if batch.attempts and in_flight:
            return False  # a retry waits until nothing earlier of its partition is in flight
        return in_flight < self.max_in_flight

    def _assign(self, batch: ProducerBatch) -> None:
        if not self.idempotent or batch.has_sequence:
            return
        state = self._state(batch.tp)
        batch.set_producer_state(self.producer_id, self.producer_epoch, state.next_sequence,
                                 self.transactional)
        state.next_sequence = increment_sequence(state.next_sequence, batch.record_count)

    def _send_produce_requests(self, now: float) -> float:
        cluster = self.net.cluster
        nodes, next_check, unknown = self.acc.ready(cluster, now, self._may_send)
        if unknown:
            with self.metadata_changed:
                self.topics.update(unknown)
            self._need_metadata()
        sendable = set()
        for node in nodes:
            conn = self.net.connection(node)
            if conn is None:
                self._need_metadata()  # the leader may have moved
                continue
            if conn.in_flight_count < self.max_in_flight:
                sendable.add(node)
        if not sendable:
            return next_check
        drained = self.acc.drain(cluster, sendable, self.config.max_request_size, now,
                                 self._may_send, self._assign)
        for node, batches in drained.items():
            self._send_batches(node, batches)
        return 0.0 if drained else next_check

    def _send_batches(self, node: int, batches: list[ProducerBatch]) -> None:
        topics: dict[str, list[tuple[int, bytes]]] = {}
        compression = self.acc.compression
        for batch in batches:
            batch.attempts += 1
            topics.setdefault(batch.tp.topic, []).append(
                (batch.tp.partition, batch.encode(compression)))
            self._state(batch.tp).in_flight.append(batch)
        transactional_id, acks = self.config.transactional_id, self.acks
        timeout_ms = self.config.request_timeout_ms
        topic_data = list(topics.items())

        def values(version: int) -> bytes:
            return produce_body(version, transactional_id, acks, timeout_ms, topic_data)

        try:
            req = self.net.send(node, ApiKey.PRODUCE, values, expect_response=self.acks != 0,
                                context={b.tp: b for b in batches},
                                max_version=self.produce_max_version)
        except KafkaError as exc:  # no usable Produce version: nothing was sent
            req = None
            for batch in batches:
                self._state(batch.tp).in_flight.remove(batch)
                self._fail(batch, exc, reset=False)
            if not isinstance(exc, RetriableError):
                self.fatal_error = exc
            return
        if req is None:  # the connection went away between ready() and now
            for batch in batches:
                self._state(batch.tp).in_flight.remove(batch)
                self._retry_or_fail(batch, self.net.unreachable(node))

    # --- responses --------------------------------------------------------------------------

    def _handle(self, req: InFlightRequest) -> None:
        if req is self._metadata_request:
            self._handle_metadata(req)
        elif req is self._pid_request:
            self._handle_init_producer_id(req)
        elif req is self._txn_request:
            self._handle_transactional(req)
        elif req.api_key == ApiKey.PRODUCE:
            self._handle_produce(req)

    def _handle_produce(self, req: InFlightRequest) -> None:
        batches: dict[TopicPartition, ProducerBatch] = req.context
        for batch in batches.values():
            state = self._partitions.get(batch.tp)
            if state is not None and batch in state.in_flight:
                state.in_flight.remove(batch)
        if req.error is not None:
            if isinstance(req.error, (NetworkError, RequestTimedOutError)):
                self._need_metadata()
            for batch in batches.values():
                self._retry_or_fail(batch, req.error)
            return
        if not req.expect_response:  # acks=0: sent is all we will ever know
            for batch in batches.values():
                self._complete(batch, -1, None)
            return
        answered = set()
        for topic in req.response.responses:
            for p in topic.partition_responses:
                tp = TopicPartition(topic.name, int(p.index))
                answered_batch = batches.get(tp)
                if answered_batch is None:
                    continue
                batch = answered_batch
                answered.add(tp)
                code = int(p.error_code)
                lat = millis(p.log_append_time)  # -1: the topic uses CreateTime
                log_append_time = lat if lat >= 0 else None
                if code == 0 or code == _DUPLICATE_SEQUENCE:
                    self._complete(batch, int(p.base_offset), log_append_time)
                    continue
                message = p.error_message or None
                error = error_for_code(code)(
                    f"{tp.topic}-{tp.partition}: {message or error_for_code(code).__name__}")
                if code in _METADATA_ERRORS:
                    self._need_metadata()
                self._retry_or_fail(batch, error)
        for tp, batch in batches.items():
            if tp not in answered:
                self._retry_or_fail(batch, NetworkError(
                    f"{tp.topic}-{tp.partition}: no answer in the produce response"))

    def _complete(self, batch: ProducerBatch, base_offset: int,
                  log_append_time: int | None) -> None:
        if self.idempotent and batch.has_sequence:
            state = self._state(batch.tp)
            if batch.producer_id == self.producer_id:
                state.expected_sequence = increment_sequence(batch.base_sequence,
                                                             batch.record_count)
        batch.complete(base_offset, log_append_time)
        self.acc.release(batch)

    def _retry_or_fail(self, batch: ProducerBatch, error: KafkaError) -> None:
        now = time.monotonic()
        retriable = isinstance(error, RetriableError)
        if (isinstance(error, OutOfOrderSequenceNumberError) and self.idempotent
                and batch.has_sequence and batch.producer_id == self.producer_id
                and batch.base_sequence != self._state(batch.tp).expected_sequence):
            # An earlier batch of this partition is not written yet (it failed and will be
            # retried), so this one arrived early: retry it after the earlier one.
            retriable = True
        elif isinstance(error, _SEQUENCE_LOST) and self.idempotent and not self.transactional:
            # The broker rejected the batch because it lost track of our sequences (or never
            # knew this producer id). Nothing was written, so it is safe to resend it under a
            # new producer id (KIP-360); these codes are only fatal for transactional producers.
            self._reset_producer_id = True
            retriable = True
        if (retriable and self.fatal_error is None and batch.attempts <= self.config.retries
                and now - batch.created < self.delivery_timeout):
            log.debug("retrying %r after %s", batch, error)
            self.acc.reenqueue(batch, now + self._backoff(batch.attempts))
            return
        if retriable and now - batch.created >= self.delivery_timeout:
            error = self._expiry_error(batch, error)
        self._fail(batch, error, reset=True)

    def _fail(self, batch: ProducerBatch, error: BaseException, reset: bool) -> None:
        if reset and self.idempotent and batch.has_sequence \
                and batch.producer_id == self.producer_id:
            # This sequence will never reach the broker: later ones would be out of order.
            if self.transactional:
                if self.on_sequence_lost is not None:
                    self.on_sequence_lost(error)  # the transaction aborts, then a new epoch
            else:
                self._reset_producer_id = True
        batch.fail(error)
        self.acc.release(batch)

    def _expiry_error(self, batch: ProducerBatch, cause: BaseException | None = None
                      ) -> KafkaTimeoutError:
        error = KafkaTimeoutError(
            f"expiring {batch.record_count} record(s) for {batch.tp.topic}-{batch.tp.partition}: "
            f"{self.delivery_timeout * 1000:.0f} ms has passed since batch creation"
            + (f" (last error: {cause})" if cause else ""))
        error.__cause__ = cause
        return error


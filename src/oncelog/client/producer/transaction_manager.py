"""The transactional producer's state machine (spec 000, "Transactional Producer"; the Java
client's TransactionManager, aiokafka's transaction_manager.py).

States and their legal predecessors live in one table; ``_transition`` is the only place that
changes the state. It is state, not IO (Kafka's TransactionManager): the API calls check the
state and queue the coordinator request the step needs (InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn: the handlers of txn_request_handlers.py), then wait on
its future; the producer's sender thread takes the next request (``next_request``), sends it
on its own network client, and hands the answer back (``on_response`` / ``on_failure``), where
the request's handler moves the state on. One request is out at a time, in order; the
coordinator loop finds the coordinator, follows it when it moves and backs off while it is busy
(CONCURRENT_TRANSACTIONS), until the call's deadline. The sender takes ``lock`` only for
these short steps, and the caller's thread never holds it while it waits.

Errors: a fenced producer (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH from the coordinator,
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ...) is in FatalError for good: every later call raises
the same error. Anything else that breaks the transaction (a failed send, a group rebalance
under send_offsets_to_transaction, ...) is abortable: commit raises it, and
``abort_transaction`` recovers; when the failure lost the partition's sequence numbers, the
abort also bumps the epoch with InitProducerId carrying the current producer id and epoch
(KIP-360), so the producer carries on without being fenced.

Transaction version 2 (KIP-890), used whenever the coordinator's broker finalizes the
``transaction.version`` feature at 2: no AddPartitionsToTxn / AddOffsetsToTxn (Produce v12 and
TxnOffsetCommit v5 let the brokers add the partitions), and every EndTxn answers with the
producer id and epoch of the next transaction (an epoch bump per transaction; sequences
restart at 0). InitProducerId is called only at start.

Two-phase commit (KIP-939, ``transaction.two.phase.commit.enable``): ``prepare`` flushes the
transaction and returns its PreparedTxnState (producer id and epoch); from then on only commit,
abort or ``complete`` are allowed. After a restart, ``init_transactions(keep_prepared_txn=True)``
keeps a prepared transaction open (the previous incarnations are fenced), and ``complete``
commits it if it is the one the caller's store recorded, and aborts it otherwise.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeoutError
from typing import Any

from ...errors import FatalError, InvalidTxnStateError, KafkaError
from ...protocol import ApiKey
from ..backoff import retry_backoff
from ..config import ClientConfig
from ..coordinator_request import BrokerVersions, CoordinatorCall, Coordinators, Send
from ..errors import IllegalStateError, KafkaTimeoutError, TransactionError
from ..types import ConsumerGroupMetadata, TopicPartition
from .txn_request_handlers import (
    AddOffsetsToTxnHandler,
    AddPartitionsToTxnHandler,
    EndTxnHandler,
    InitProducerIdHandler,
    TxnOffsetCommitHandler,
    TxnRequestHandler,
)

log = logging.getLogger(__name__)

# How long a caller waits past its deadline for the sender to end the request (it checks the
# deadline at least every second) before giving up on it itself.
_GRACE_S = 2.0


class PreparedTxnState:
    """A prepared transaction's identity (KIP-939): its producer id and epoch, written to a
    database as ``str(state)`` and read back with ``PreparedTxnState(text)``. The empty state
    (no transaction) is ``PreparedTxnState()``, whose text is ``""``."""

    __slots__ = ("producer_epoch", "producer_id")

    def __init__(self, serialized: str | None = None, *, producer_id: int = -1,
                 producer_epoch: int = -1) -> None:
        if serialized:
            pid, sep, epoch = serialized.strip().partition(":")
            try:
                producer_id, producer_epoch = int(pid), int(epoch)
            except ValueError:
                raise ValueError(f"not a PreparedTxnState: {serialized!r} (expected "
                                 "'producer_id:epoch')") from None
            if not sep or producer_id < 0 or not 0 <= producer_epoch <= 32767:
                raise ValueError(f"not a PreparedTxnState: {serialized!r}")
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch

    @property
    def has_transaction(self) -> bool:
        """False for the state of "no prepared transaction" (producer id -1)."""
        return self.producer_id >= 0

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.producer_epoch}" if self.has_transaction else ""

    def __repr__(self) -> str:
        return f"PreparedTxnState({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PreparedTxnState) and \
            (self.producer_id, self.producer_epoch) == (other.producer_id, other.producer_epoch)

    def __hash__(self) -> int:
        return hash((self.producer_id, self.producer_epoch))


class TxnState(enum.Enum):
    UNINITIALIZED = "Uninitialized"
    INITIALIZING = "Initializing"
    READY = "Ready"
    IN_TRANSACTION = "InTransaction"
    PREPARED = "PreparedTransaction"
    COMMITTING = "CommittingTransaction"
    ABORTING = "AbortingTransaction"
    ABORTABLE_ERROR = "AbortableError"
    FATAL_ERROR = "FatalError"


T = TxnState
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    # A call that timed out goes back where it came from, so that it can be called again
    # (InitProducerId, EndTxn: a retry of one the coordinator already did succeeds).
    T.UNINITIALIZED: frozenset({T.INITIALIZING}),
    T.INITIALIZING: frozenset({T.UNINITIALIZED, T.ABORTING}),
    T.READY: frozenset({T.INITIALIZING, T.COMMITTING, T.ABORTING}),
    T.IN_TRANSACTION: frozenset({T.READY, T.COMMITTING}),
    # KIP-939: prepared by prepare(), or kept by init_transactions(keep_prepared_txn=True).
    T.PREPARED: frozenset({T.IN_TRANSACTION, T.INITIALIZING, T.COMMITTING, T.ABORTING}),
    T.COMMITTING: frozenset({T.IN_TRANSACTION, T.PREPARED}),
    T.ABORTING: frozenset({T.IN_TRANSACTION, T.ABORTABLE_ERROR, T.PREPARED}),
    T.ABORTABLE_ERROR: frozenset({T.IN_TRANSACTION, T.COMMITTING, T.ABORTABLE_ERROR,
                                  T.ABORTING, T.INITIALIZING, T.PREPARED}),
    T.FATAL_ERROR: frozenset(TxnState),
}


class _Pending:
    """A queued coordinator call and the future its caller waits on (Kafka's
    TransactionalRequestResult). A handler's ``follow_up`` goes out next under the same
    future (AddOffsetsToTxn, then TxnOffsetCommit; an abort's EndTxn, then the epoch bump)."""

    __slots__ = ("call", "future")

    def __init__(self, call: CoordinatorCall, future: Future) -> None:
        self.call = call
        self.future = future


class TransactionManager:
    def __init__(self, config: ClientConfig,
                 set_producer: Callable[[int, int], None],
                 flush: Callable[[float | None], None],
                 set_transaction_v2: Callable[[bool], None] = lambda _on: None,
                 wakeup: Callable[[], None] = lambda: None) -> None:
        self.transactional_id: str = config.transactional_id
        self.timeout_ms: int = config.transaction_timeout_ms
        self.config = config
        self._set_producer = set_producer
        self._flush = flush
        self._wakeup = wakeup  # the sender: a request is queued
        self.lock = threading.RLock()
        self.state = T.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.error: KafkaError | None = None
        self.epoch_bump_needed = False
        self.partitions: set[TopicPartition] = set()
        self.offsets_added = False
        self.futures: list[Future] = []
        self.coordinators = Coordinators()
        self._backoff = retry_backoff(config)
        self._queue: deque[_Pending] = deque()
        self._set_transaction_v2 = set_transaction_v2
        self.transaction_v2 = False  # KIP-890: decided at init_transactions
        self.two_phase: bool = config.transaction_two_phase_commit_enable
        self.prepared: PreparedTxnState | None = None
        self._nothing_kept = False  # init_transactions(keep_prepared_txn=True) found nothing
        self._kept = False  # ... or kept a transaction of an earlier incarnation

    # -- state ---------------------------------------------------------------------------------

    def _transition(self, state: TxnState) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalStateError(f"transactional producer {self.transactional_id!r}: cannot "
                                    f"go from {self.state.value} to {state.value}")
        log.debug("transaction %r: %s -> %s", self.transactional_id, self.state.value,
                  state.value)
        self.state = state

    def fail(self, error: KafkaError) -> KafkaError:
        """Record ``error``: fatal ones end the producer, others the transaction."""
        if isinstance(error, FatalError):
            self.error = error
            self._transition(T.FATAL_ERROR)
        elif self.state != T.FATAL_ERROR:
            self.error = error
            self._transition(T.ABORTABLE_ERROR)
        return error

    def _require(self, *states: TxnState) -> None:
        if self.state == T.FATAL_ERROR and self.error is not None:
            raise self.error
        if self.state not in states:
            if self.state == T.ABORTABLE_ERROR and self.error is not None:
                raise TransactionError(f"the transaction must be aborted: {self.error}") \
                    from self.error
            raise IllegalStateError(
                f"transactional producer {self.transactional_id!r} is {self.state.value}; this "
                f"call needs {' or '.join(s.value for s in states)}")

    def sequence_lost(self, error: KafkaError) -> None:
        """The sender could not write a batch whose sequence numbers are now spent: the
        transaction must abort (commit sees the batch's failed future), and the epoch be
        bumped after (KIP-360). Called on the sender thread while it settles batches; a flag
        is all it sets."""
        log.info("transaction %r: a batch was lost (%s); abort, then a new epoch",
                 self.transactional_id, error)
        self.epoch_bump_needed = True

    # -- the queue the sender drains (sans IO) ---------------------------------------------------

    def _enqueue(self, handler: TxnRequestHandler, deadline: float) -> _Pending:
        """Queue ``handler``'s request (under ``lock``); the sender sends it."""
        pending = _Pending(self._call(handler, deadline), Future())
        self._queue.append(pending)
        self._wakeup()
        return pending

    def _call(self, handler: TxnRequestHandler, deadline: float) -> CoordinatorCall:
        return CoordinatorCall(handler, deadline, self._backoff, self.coordinators,
                               self.config.request_timeout_ms)

    def next_request(self, now: float) -> Send | float | None:
        """What to send now (a ``Send``), or how long nothing is due (seconds); None when no
        request is queued or one is in flight."""
        with self.lock:
            while self._queue:
                head = self._queue[0]
                if head.future.done():  # its caller gave up on it
                    self._queue.popleft()
                    continue
                step = head.call.poll(now)
                if head.call.done:
                    self._finish(head)
                    continue
                return step
            return None

    def request_values(self, send: Send, broker: BrokerVersions) -> Any:
        """The body of ``send`` for the coordinator's ``broker`` versions; None if the handler
        refused (the call then fails: e.g. no two-phase commit on that broker)."""
        with self.lock:
            return send.values(broker)

    def on_response(self, send: Send, response: Any, now: float) -> None:
        with self.lock:
            send.call.on_response(send, response, now)
            self._settle(send.call)

    def on_failure(self, send: Send, error: KafkaError, now: float) -> None:
        """``send`` got no answer (unreachable node, dropped connection, timeout)."""
        with self.lock:
            send.call.on_failure(send, error, now)
            self._settle(send.call)

    def _settle(self, call: CoordinatorCall) -> None:
        if call.done and self._queue and self._queue[0].call is call:
            self._finish(self._queue[0])

    def _finish(self, pending: _Pending) -> None:
        self._queue.popleft()
        call, future = pending.call, pending.future
        if future.done():
            return
        if call.error is not None:
            future.set_exception(call.error)
            return
        assert isinstance(call.handler, TxnRequestHandler)
        follow_up = call.handler.follow_up
        if follow_up is not None:
            self._queue.appendleft(_Pending(self._call(follow_up, call.deadline), future))
        else:
            future.set_result(call.response)

    def _await(self, pending: _Pending | None, deadline: float) -> None:
        """Wait (not holding ``lock``) for the queued request's end; raise its error."""
        if pending is None:
            return
        try:
            pending.future.result(max(0.0, deadline - time.monotonic()) + _GRACE_S)
            return
        except FutureTimeoutError:
            pass
        with self.lock:  # the sender did not end it (it is stuck, or gone): give up on it
            if not pending.future.done():
                pending.call.fail(KafkaTimeoutError(
                    "transactional request did not complete in time"))
                pending.future.set_exception(pending.call.error)  # type: ignore[arg-type]
        pending.future.result(0)

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.config.max_block_ms / 1000
        return time.monotonic() + timeout

    # -- what the handlers do on success (under lock, on the sender's thread) ------------------

    def initialized(self, response: Any, broker: BrokerVersions, keep_prepared_txn: bool,
                     bump: bool) -> None:
        self.producer_id, self.producer_epoch = int(response.producer_id), \
            int(response.producer_epoch)
        self._set_producer(self.producer_id, self.producer_epoch)
        self.epoch_bump_needed = False
        self._choose_protocol(broker)
        if bump:  # the abort's KIP-360 epoch bump: the abort is over
            self.prepared = None
            self._kept = False
            self._transition(T.READY)
            return
        kept = PreparedTxnState(producer_id=int(getattr(response, "ongoing_txn_producer_id", -1)),
                                producer_epoch=int(getattr(response, "ongoing_txn_producer_epoch",
                                                           -1)))
        if keep_prepared_txn and kept.has_transaction:
            self.prepared = kept
            self._kept = True
            self._transition(T.PREPARED)  # only commit, abort or complete from here
        else:
            self._nothing_kept = keep_prepared_txn
            self._transition(T.READY)

    def _choose_protocol(self, broker: BrokerVersions) -> None:
        """KIP-890: transaction version 2 when the coordinator's broker finalizes it and offers
        its request versions (EndTxn v5, Produce v12)."""
        versions = broker.api_versions
        self.transaction_v2 = (broker.features.get("transaction.version", 0) >= 2
                               and versions.get(ApiKey.END_TXN, (0, 0))[1] >= 5
                               and versions.get(ApiKey.PRODUCE, (0, 0))[1] >= 12)
        self._set_transaction_v2(self.transaction_v2)

    def ended(self, commit: bool, response: Any | None) -> TxnRequestHandler | None:
        """EndTxn succeeded (or was not needed): READY, after the epoch bump an abort may
        need (returned, to go out next)."""
        if self.transaction_v2 and response is not None \
                and int(getattr(response, "producer_id", -1)) >= 0:
            # KIP-890: the next transaction's producer id and epoch (sequences restart at 0).
            self.producer_id = int(response.producer_id)
            self.producer_epoch = int(response.producer_epoch)
            self._set_producer(self.producer_id, self.producer_epoch)
        if not commit and self.epoch_bump_needed and not self.transaction_v2:
            # KIP-360: a new epoch, the same producer id; sequences restart at 0.
            # (Transaction version 2 bumped it with the abort itself.)
            self._transition(T.INITIALIZING)
            return InitProducerIdHandler(self, self.producer_id, self.producer_epoch, bump=True)
        if not commit:
            self.epoch_bump_needed = False
        self.prepared = None
        self._kept = False
        self._transition(T.READY)
        return None

    # -- the API, sans IO: each returns what to wait for -----------------------------------------

    def initialize(self, deadline: float, keep_prepared_txn: bool = False) -> _Pending:
        with self.lock:
            self._require(T.UNINITIALIZED)
            self._transition(T.INITIALIZING)
            return self._enqueue(
                InitProducerIdHandler(self, -1, -1, keep_prepared_txn=keep_prepared_txn), deadline)

    def begin_transaction(self) -> None:
        with self.lock:
            self._require(T.READY)
            self._nothing_kept = False
            self._transition(T.IN_TRANSACTION)
            self.partitions = set()
            self.offsets_added = False
            self.futures = []

    def check_can_send(self) -> None:
        with self.lock:
            self._require(T.IN_TRANSACTION)

    def maybe_add_partition(self, tp: TopicPartition, deadline: float) -> _Pending | None:
        """spec 000 step 4.1: a partition joins the transaction before its first batch."""
        return self.maybe_add_partitions([tp], deadline)

    def maybe_add_partitions(self, tps: Iterable[TopicPartition], deadline: float
                             ) -> _Pending | None:
        """Those of ``tps`` not in the transaction yet join it, in one AddPartitionsToTxn
        (as the Java client adds every new partition of a drain in one request)."""
        with self.lock:
            self._require(T.IN_TRANSACTION)
            new = sorted(set(tps) - self.partitions)
            if not new:
                return None
            if self.transaction_v2:
                self.partitions.update(new)  # the partition leader adds it (Produce v12)
                return None
            return self._enqueue(AddPartitionsToTxnHandler(self, new), deadline)

    def add_offsets(self, offsets: Mapping[TopicPartition, int] | Iterable[Any],
                    group: ConsumerGroupMetadata | str, deadline: float) -> _Pending:
        """spec 000 steps 4.3 and 4.4 (with KIP-447's group metadata)."""
        meta = group if isinstance(group, ConsumerGroupMetadata) else ConsumerGroupMetadata(group)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp, offset in _offset_items(offsets):
            by_topic.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": ""})
        with self.lock:
            self._require(T.IN_TRANSACTION)
            commit = TxnOffsetCommitHandler(self, meta, by_topic)
            if self.transaction_v2:  # the group coordinator adds it (TxnOffsetCommit v5)
                self.offsets_added = True
                return self._enqueue(commit, deadline)
            return self._enqueue(AddOffsetsToTxnHandler(self, meta.group_id, commit), deadline)

    def begin_end(self, commit: bool, before: TxnState, deadline: float) -> _Pending | None:
        """Commit or abort (Kafka's beginCommit / beginAbort), once the records are flushed;
        None when it is already over (the coordinator never heard of the transaction)."""
        with self.lock:
            self._require(before)
            if commit and before == T.IN_TRANSACTION:
                self._check_sent()
            self._transition(T.COMMITTING if commit else T.ABORTING)
            if self.partitions or self.offsets_added or self._kept:
                return self._enqueue(EndTxnHandler(self, commit), deadline)
            bump = self.ended(commit, None)
            return None if bump is None else self._enqueue(bump, deadline)

    def _check_sent(self) -> None:
        failed = next((f.exception() for f in self.futures if f.exception() is not None), None)
        if failed is not None:
            error = failed if isinstance(failed, FatalError) else TransactionError(
                f"a record of the transaction was not written: {failed}")
            raise self.fail(error)

    # -- the API the producer calls (blocking) --------------------------------------------------

    def init_transactions(self, timeout: float | None, keep_prepared_txn: bool = False) -> None:
        deadline = self._deadline(timeout)
        pending = self.initialize(deadline, keep_prepared_txn)
        try:
            self._await(pending, deadline)
        except KafkaTimeoutError:
            with self.lock:
                if self.state == T.INITIALIZING:
                    self._transition(T.UNINITIALIZED)  # call init_transactions again
            raise

    def add_partition(self, tp: TopicPartition, deadline: float) -> None:
        self._await(self.maybe_add_partition(tp, deadline), deadline)

    def add_partitions(self, tps: Iterable[TopicPartition], deadline: float) -> None:
        self._await(self.maybe_add_partitions(tps, deadline), deadline)

    def track(self, future: Future) -> None:
        self.futures.append(future)

    def send_failed(self, error: BaseException) -> None:
        """A record of the transaction failed in send(), before the sender had it (unknown
        partition, too large, no metadata in time, not bytes, ...). The transaction cannot
        commit without it, so it must abort: commit and prepare raise from now on. A fatal
        error ends the producer. (The Java client: KafkaProducer.doSend's catch blocks ->
        TransactionManager.maybeTransitionToErrorState.)"""
        with self.lock:
            if self.state == T.FATAL_ERROR:
                return
            if isinstance(error, FatalError):
                self.fail(error)
            elif self.state == T.IN_TRANSACTION:  # already abortable: keep the first cause
                failed = TransactionError(f"a record of the transaction was not written: "
                                          f"{type(error).__name__}: {error}")
                failed.__cause__ = error
                self.fail(failed)

    def send_offsets(self, offsets: Mapping[TopicPartition, int] | Iterable[Any],
                     group: ConsumerGroupMetadata | str, timeout: float | None) -> None:
        deadline = self._deadline(timeout)
        self._await(self.add_offsets(offsets, group, deadline), deadline)

    def commit(self, timeout: float | None) -> None:
        with self.lock:
            self._require(T.IN_TRANSACTION, T.PREPARED)
            deadline = self._deadline(timeout)
            before = self.state
        if before == T.IN_TRANSACTION:
            # Not under the lock: the sender thread finishes the batches meanwhile.
            self._flush(max(0.0, deadline - time.monotonic()))
        pending = self.begin_end(True, before, deadline)
        try:
            self._await(pending, deadline)
        except KafkaTimeoutError:
            with self.lock:
                if self.state == T.COMMITTING:
                    self._transition(before)  # commit_transaction again
            raise

    def prepare(self, timeout: float | None) -> PreparedTxnState:
        """KIP-939 phase one: flush every record of the transaction; it is then prepared (it
        can neither take more records nor time out) and only commit, abort or complete may
        follow. Returns its identity for the caller's own store."""
        with self.lock:
            if not self.two_phase:
                raise InvalidTxnStateError(
                    "prepare_transaction needs transaction.two.phase.commit.enable=true")
            self._require(T.IN_TRANSACTION)
            deadline = self._deadline(timeout)
        self._flush(max(0.0, deadline - time.monotonic()))
        with self.lock:
            self._require(T.IN_TRANSACTION)
            self._check_sent()
            self.prepared = PreparedTxnState(producer_id=self.producer_id,
                                             producer_epoch=self.producer_epoch)
            self._transition(T.PREPARED)
            return self.prepared

    def complete(self, state: PreparedTxnState, timeout: float | None) -> None:
        """KIP-939 recovery: commit the prepared transaction if ``state`` is its identity,
        abort it otherwise. A no-op when init_transactions(keep_prepared_txn=True) found no
        transaction to keep (it was completed before)."""
        with self.lock:
            if self.state == T.READY and self._nothing_kept:
                return
            if self.state != T.PREPARED:
                if self.state == T.FATAL_ERROR and self.error is not None:
                    raise self.error
                raise InvalidTxnStateError(
                    f"complete_transaction needs a prepared transaction; the producer is "
                    f"{self.state.value}")
            commit = state == self.prepared
        if commit:
            self.commit(timeout)
        else:
            self.abort(timeout)

    def abort(self, timeout: float | None) -> None:
        with self.lock:
            self._require(T.IN_TRANSACTION, T.ABORTABLE_ERROR, T.PREPARED)
            deadline = self._deadline(timeout)
            before = self.state
        try:
            self._flush(max(0.0, deadline - time.monotonic()))  # not under the lock
        except KafkaTimeoutError:
            pass  # what is still unsent is aborted with the rest
        pending = self.begin_end(False, before, deadline)
        try:
            self._await(pending, deadline)
        except KafkaTimeoutError as exc:
            with self.lock:
                if self.state in (T.ABORTING, T.INITIALIZING):
                    self.error = exc
                    self._transition(T.ABORTABLE_ERROR)  # abort_transaction again
            raise

    def close(self) -> None:
        """The producer closes: whoever still waits for a request is told."""
        with self.lock:
            while self._queue:
                pending = self._queue.popleft()
                if not pending.future.done():
                    pending.future.set_exception(KafkaError("the producer was closed"))


def _offset_items(offsets: Mapping[TopicPartition, int] | Iterable[Any]
                  ) -> list[tuple[TopicPartition, int]]:
    """{TopicPartition: next offset}, or confluent-style objects with .topic/.partition/.offset."""
    if isinstance(offsets, Mapping):
        return [(TopicPartition(tp.topic, tp.partition), int(o)) for tp, o in offsets.items()]
    items: Iterable[Any] = offsets
    return [(TopicPartition(o.topic, o.partition), int(o.offset)) for o in items]

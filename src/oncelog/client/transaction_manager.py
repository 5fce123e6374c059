"""The transactional producer's state machine (spec 000, "Transactional Producer"; the Java
client's TransactionManager, aiokafka's transaction_manager.py).

States and their legal predecessors live in one table; ``_transition`` is the only place that
changes the state. The coordinator requests (FindCoordinator, InitProducerId,
AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn) go out on a network client of
the manager's own, from the caller's thread: the producer's API calls block anyway, and the
sender thread keeps producing meanwhile.

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
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from ..errors import (
    AbortableError,
    ConcurrentTransactionsError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    FatalError,
    InvalidTxnStateError,
    KafkaError,
    NotCoordinatorError,
    RetriableError,
    UnsupportedVersionError,
    error_for_code,
)
from ..protocol import ApiKey
from .config import ClientConfig
from .errors import KafkaTimeoutError
from .network import NetworkClient
from .types import ConsumerGroupMetadata, TopicPartition

log = logging.getLogger(__name__)

KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION = 0, 1
# The last versions of the older protocol (transaction version 0/1).
_V1_MAX = {ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 3}
# AddPartitionsToTxn v4+ is the brokers' (verification, batched by transactional id).
_CLIENT_MAX = {ApiKey.ADD_PARTITIONS_TO_TXN: 3}
_COORDINATOR_MOVED = (NotCoordinatorError.code, CoordinatorNotAvailableError.code)
_BUSY = (CoordinatorLoadInProgressError.code, ConcurrentTransactionsError.code)


class TransactionError(AbortableError):
    """The transaction cannot commit; abort it (and start a new one)."""


class IllegalStateError(KafkaError):
    """A transactional API called in a state that does not allow it (the Java client's
    IllegalStateException)."""


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


class TransactionManager:
    def __init__(self, config: ClientConfig, client_id: str,
                 set_producer: Callable[[int, int], None],
                 flush: Callable[[float | None], None],
                 set_transaction_v2: Callable[[bool], None] = lambda _on: None) -> None:
        self.transactional_id: str = config.transactional_id
        self.timeout_ms: int = config.transaction_timeout_ms
        self.config = config
        self.net = NetworkClient(config, f"{client_id}-txn")
        self._set_producer = set_producer
        self._flush = flush
        self.lock = threading.RLock()
        self.state = T.UNINITIALIZED
        self.producer_id = -1
        self.producer_epoch = -1
        self.error: KafkaError | None = None
        self.epoch_bump_needed = False
        self.partitions: set[TopicPartition] = set()
        self.offsets_added = False
        self.futures: list[Future] = []
        self._coordinators: dict[tuple[int, str], int] = {}
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

    def _fail(self, error: KafkaError) -> KafkaError:
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
        bumped after (KIP-360). Called on the sender thread, which must never wait for
        ``lock``: the caller's thread may hold it while it waits for the sender (flush)."""
        log.info("transaction %r: a batch was lost (%s); abort, then a new epoch",
                 self.transactional_id, error)
        self.epoch_bump_needed = True

    # -- coordinator requests ------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.config.max_block_ms / 1000
        return time.monotonic() + timeout

    def _coordinator(self, key_type: int, key: str, deadline: float) -> int:
        node = self._coordinators.get((key_type, key))
        if node is None:
            node = self._coordinators[(key_type, key)] = self.net.find_coordinator(
                key_type, key, deadline)
        return node

    def _wait(self, deadline: float, error: KafkaError) -> None:
        if time.monotonic() + self.config.retry_backoff_ms / 1000 >= deadline:
            raise KafkaTimeoutError(f"transactional request did not complete in time: {error}")
        time.sleep(self.config.retry_backoff_ms / 1000)

    def _call(self, api: ApiKey, values: dict[str, Any], deadline: float,
              error_of: Callable[[Any], int], key_type: int = KEY_TYPE_TRANSACTION,
              key: str | None = None) -> tuple[Any, int]:
        """Send to the coordinator, following it when it moves and waiting while it is busy;
        returns the response and its error code."""
        key = key or self.transactional_id
        max_version = _CLIENT_MAX.get(api) if self.transaction_v2 else _V1_MAX.get(api)
        while True:
            node = self._coordinator(key_type, key, deadline)
            try:
                response = self.net.request_any(api, values, deadline, node_id=node,
                                                max_version=max_version, single_attempt=True)
            except RetriableError as exc:
                self._coordinators.pop((key_type, key), None)
                self._wait(deadline, exc)
                continue
            code = error_of(response)
            if code in _COORDINATOR_MOVED:
                self._coordinators.pop((key_type, key), None)
            if code in _COORDINATOR_MOVED or code in _BUSY:
                self._wait(deadline, error_for_code(code)(api.name))
                continue
            return response, code

    def _init_producer_id(self, deadline: float, producer_id: int, producer_epoch: int,
                          keep_prepared_txn: bool = False) -> PreparedTxnState:
        """InitProducerId; returns the kept transaction's state (KIP-939; empty if none)."""
        if self.two_phase or keep_prepared_txn:
            node = self._coordinator(KEY_TYPE_TRANSACTION, self.transactional_id, deadline)
            conn = self.net.connection(node)  # connected: its ApiVersions are known
            if conn is not None and conn.api_versions.get(ApiKey.INIT_PRODUCER_ID,
                                                          (0, 0))[1] < 6:
                raise self._fail(UnsupportedVersionError(
                    "the transaction coordinator does not support two-phase commit "
                    "(InitProducerId v6, KIP-939)"))
        response, code = self._call(ApiKey.INIT_PRODUCER_ID, {
            "transactional_id": self.transactional_id,
            "transaction_timeout": -1 if self.two_phase else self.timeout_ms,
            "producer_id": producer_id, "producer_epoch": producer_epoch,
            "enable2_pc": self.two_phase, "keep_prepared_txn": keep_prepared_txn},
            deadline, lambda r: int(r.error_code))
        if code:
            error = error_for_code(code)(f"InitProducerId {self.transactional_id!r}")
            raise self._fail(error if isinstance(error, FatalError) else TransactionError(
                f"InitProducerId failed: {error}"))
        self.producer_id, self.producer_epoch = int(response.producer_id), \
            int(response.producer_epoch)
        self._set_producer(self.producer_id, self.producer_epoch)
        self.epoch_bump_needed = False
        self._choose_protocol()
        return PreparedTxnState(producer_id=int(getattr(response, "ongoing_txn_producer_id", -1)),
                                producer_epoch=int(getattr(response, "ongoing_txn_producer_epoch",
                                                           -1)))

    def _choose_protocol(self) -> None:
        """KIP-890: transaction version 2 when the coordinator's broker finalizes it and offers
        its request versions (EndTxn v5, Produce v12)."""
        node = self._coordinators.get((KEY_TYPE_TRANSACTION, self.transactional_id))
        versions, features = self.net.broker_versions(node) if node is not None else ({}, {})
        self.transaction_v2 = (features.get("transaction.version", 0) >= 2
                               and versions.get(ApiKey.END_TXN, (0, 0))[1] >= 5
                               and versions.get(ApiKey.PRODUCE, (0, 0))[1] >= 12)
        self._set_transaction_v2(self.transaction_v2)

    # -- the API -------------------------------------------------------------------------------

    def init_transactions(self, timeout: float | None, keep_prepared_txn: bool = False) -> None:
        with self.lock:
            self._require(T.UNINITIALIZED)
            self._transition(T.INITIALIZING)
            try:
                kept = self._init_producer_id(self._deadline(timeout), -1, -1,
                                              keep_prepared_txn=keep_prepared_txn)
            except KafkaTimeoutError:
                self._transition(T.UNINITIALIZED)  # call init_transactions again
                raise
            if keep_prepared_txn and kept.has_transaction:
                self.prepared = kept
                self._kept = True
                self._transition(T.PREPARED)  # only commit, abort or complete from here
            else:
                self._nothing_kept = keep_prepared_txn
                self._transition(T.READY)

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

    def add_partition(self, tp: TopicPartition, deadline: float) -> None:
        """spec 000 step 4.1: a partition joins the transaction before its first batch."""
        with self.lock:
            self._require(T.IN_TRANSACTION)
            if tp in self.partitions:
                return
            if self.transaction_v2:
                self.partitions.add(tp)  # the partition leader adds it (Produce v12)
                return
            _, code = self._call(ApiKey.ADD_PARTITIONS_TO_TXN, {
                "v3_and_below_transactional_id": self.transactional_id,
                "v3_and_below_producer_id": self.producer_id,
                "v3_and_below_producer_epoch": self.producer_epoch,
                "v3_and_below_topics": [{"name": tp.topic, "partitions": [tp.partition]}]},
                deadline, _partition_error)
            if code:
                raise self._fail(_txn_error(code, f"AddPartitionsToTxn {tp}"))
            self.partitions.add(tp)

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
                self._fail(error)
            elif self.state == T.IN_TRANSACTION:  # already abortable: keep the first cause
                failed = TransactionError(f"a record of the transaction was not written: "
                                          f"{type(error).__name__}: {error}")
                failed.__cause__ = error
                self._fail(failed)

    def send_offsets(self, offsets: Mapping[TopicPartition, int] | Iterable[Any],
                     group: ConsumerGroupMetadata | str, timeout: float | None) -> None:
        """spec 000 steps 4.3 and 4.4 (with KIP-447's group metadata)."""
        meta = group if isinstance(group, ConsumerGroupMetadata) else ConsumerGroupMetadata(group)
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp, offset in _offset_items(offsets):
            by_topic.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": ""})
        with self.lock:
            self._require(T.IN_TRANSACTION)
            deadline = self._deadline(timeout)
            if not self.transaction_v2:  # else the group coordinator adds it (TxnOffsetCommit v5)
                _, code = self._call(ApiKey.ADD_OFFSETS_TO_TXN, {
                    "transactional_id": self.transactional_id, "producer_id": self.producer_id,
                    "producer_epoch": self.producer_epoch, "group_id": meta.group_id},
                    deadline, lambda r: int(r.error_code))
                if code:
                    raise self._fail(_txn_error(code, f"AddOffsetsToTxn {meta.group_id!r}"))
            self.offsets_added = True
            _, code = self._call(ApiKey.TXN_OFFSET_COMMIT, {
                "transactional_id": self.transactional_id, "group_id": meta.group_id,
                "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "generation_id": meta.generation_id, "member_id": meta.member_id,
                "group_instance_id": meta.group_instance_id,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]},
                deadline, _offset_commit_error, KEY_TYPE_GROUP, meta.group_id)
            if code:
                raise self._fail(_txn_error(code, f"TxnOffsetCommit {meta.group_id!r}"))

    def commit(self, timeout: float | None) -> None:
        with self.lock:
            self._require(T.IN_TRANSACTION, T.PREPARED)
            deadline = self._deadline(timeout)
            before = self.state
        if before == T.IN_TRANSACTION:
            # Not under the lock: the sender thread finishes the batches meanwhile.
            self._flush(max(0.0, deadline - time.monotonic()))
        with self.lock:
            self._require(before)
            if before == T.IN_TRANSACTION:
                self._check_sent()
            self._transition(T.COMMITTING)
            try:
                self._end(True, deadline)
            except KafkaTimeoutError:
                self._transition(before)  # commit_transaction again
                raise
            self.prepared = None
            self._kept = False
            self._transition(T.READY)

    def _check_sent(self) -> None:
        failed = next((f.exception() for f in self.futures if f.exception() is not None), None)
        if failed is not None:
            error = failed if isinstance(failed, FatalError) else TransactionError(
                f"a record of the transaction was not written: {failed}")
            raise self._fail(error)

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
        with self.lock:
            self._require(before)
            self._transition(T.ABORTING)
            try:
                self._end(False, deadline)
                if self.epoch_bump_needed and not self.transaction_v2:
                    # KIP-360: a new epoch, the same producer id; sequences restart at 0.
                    # (Transaction version 2 bumped it with the abort itself.)
                    self._transition(T.INITIALIZING)
                    self._init_producer_id(deadline, self.producer_id, self.producer_epoch)
            except KafkaTimeoutError as exc:
                self.error = exc
                self._transition(T.ABORTABLE_ERROR)  # abort_transaction again
                raise
            self.epoch_bump_needed = False
            self.prepared = None
            self._kept = False
            self._transition(T.READY)

    def _end(self, commit: bool, deadline: float) -> None:
        if not self.partitions and not self.offsets_added and not self._kept:
            return  # the coordinator never heard of this transaction
        response, code = self._call(ApiKey.END_TXN, {
            "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch, "committed": commit}, deadline,
            lambda r: int(r.error_code))
        if code:
            raise self._fail(_txn_error(code, "EndTxn"))
        if self.transaction_v2 and int(getattr(response, "producer_id", -1)) >= 0:
            # KIP-890: the next transaction's producer id and epoch (sequences restart at 0).
            self.producer_id = int(response.producer_id)
            self.producer_epoch = int(response.producer_epoch)
            self._set_producer(self.producer_id, self.producer_epoch)

    def close(self) -> None:
        self.net.close()


def _txn_error(code: int, what: str) -> KafkaError:
    error = error_for_code(code)(what)
    return error if isinstance(error, FatalError) else TransactionError(f"{what}: {error}")


def _partition_error(response: Any) -> int:
    for t in response.results_by_topic_v3_and_below:
        for p in t.results_by_partition:
            if int(p.partition_error_code):
                return int(p.partition_error_code)
    return 0


def _offset_commit_error(response: Any) -> int:
    for t in response.topics:
        for p in t.partitions:
            if int(p.error_code):
                return int(p.error_code)
    return 0


def _offset_items(offsets: Mapping[TopicPartition, int] | Iterable[Any]
                  ) -> list[tuple[TopicPartition, int]]:
    """{TopicPartition: next offset}, or confluent-style objects with .topic/.partition/.offset."""
    if isinstance(offsets, Mapping):
        return [(TopicPartition(tp.topic, tp.partition), int(o)) for tp, o in offsets.items()]
    items: Iterable[Any] = offsets
    return [(TopicPartition(o.topic, o.partition), int(o.offset)) for o in items]

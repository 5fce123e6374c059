"""The transaction coordinator, sans IO (spec 000, "Transaction Coordinator", Data Flow steps
2, 4.1, 4.3, 5.1-5.3; KIP-360 for InitProducerId with the current producer id and epoch;
KIP-890 transaction version 2: an epoch bump on every commit and abort, partitions added by the
partition leaders, verification for older clients; KIP-939: two-phase commit).

Transaction version 2 (a client that ends its transaction with EndTxn v5+): EndTxn writes
PrepareCommit / PrepareAbort with the epoch + 1, the markers carry it, and the answer gives the
client the producer id and epoch of its next transaction -- a new producer id once the epoch
would reach its maximum. ``last_producer_*`` keeps what the client held, so that a retried
EndTxn is answered instead of fenced; ``next_producer_*`` what it holds next when that differs
from the markers' id and epoch (an overflow, or a kept two-phase-commit transaction).

It takes requests and the current time and returns an ``Outcome``: an error name or the
answer, and the effects to carry out, in order. Effects are ``WriteTxnLog`` (append this record
to the transaction log; report back with ``write_done``), ``SendMarkers`` (write these
COMMIT/ABORT markers; report back with ``markers_done``) and ``Pause`` (wait before the effects
after it: a refused completion record is written again after one). A state change becomes
visible only once its record is written: until then the transactional id has a pending change,
and requests for it answer CONCURRENT_TRANSACTIONS. server/txn_service.py carries the effects out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from ..records.batch import Record
from .log_format import TxnLogFormatError, decode_key, decode_value
from .state import MAX_PRODUCER_EPOCH, TWO_PHASE_TIMEOUT, TransactionMetadata, TransactionState

log = logging.getLogger("oncelog.txn")

S = TransactionState
NO_PRODUCER_ID = -1

# KIP-588: PRODUCER_FENCED from these request versions on; INVALID_PRODUCER_EPOCH before.
PRODUCER_FENCED_SINCE = {"init_producer_id": 4, "add_partitions": 2, "add_offsets": 2,
                         "end_txn": 2}


@dataclass(frozen=True)
class WriteTxnLog:
    transactional_id: str
    metadata: TransactionMetadata | None  # None: a tombstone


@dataclass(frozen=True)
class SendMarkers:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[tuple[str, int]]
    coordinator_epoch: int
    # the client's transaction version: 2 makes the partitions refuse a marker that is not
    # newer than the producer's open transaction there (KIP-1228, KAFKA-17754)
    transaction_version: int = 0


@dataclass(frozen=True)
class Pause:
    """Wait this long before carrying out the effects after it."""
    ms: int


Effect = WriteTxnLog | SendMarkers | Pause

# A transaction's completion record that could not be written is written again after this.
COMPLETE_RETRY_MS = 500


@dataclass
class Outcome:
    error: ErrorCode | None = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    effects: list[Effect] = field(default_factory=list)
    # InitProducerId v6 (KIP-939): the kept transaction's producer id and epoch, or -1.
    ongoing_producer_id: int = NO_PRODUCER_ID
    ongoing_producer_epoch: int = -1


def _fenced(api: str, version: int) -> ErrorCode:
    return ErrorCode.producer_fenced if version >= PRODUCER_FENCED_SINCE[api] else \
        ErrorCode.invalid_producer_epoch


class TransactionCoordinator:
    def __init__(self, *, allocate_producer_id: Callable[[], int], max_timeout_ms: int,
                 expiration_ms: int, coordinator_epoch: int = 0,
                 two_phase_commit_enabled: bool = False, transaction_version: int = 2) -> None:
        self.allocate_producer_id = allocate_producer_id
        self.transaction_version = transaction_version  # the cluster's feature level
        self.two_phase_commit_enabled = two_phase_commit_enabled
        self.max_timeout_ms = max_timeout_ms
        self.expiration_ms = expiration_ms
        self.coordinator_epoch = coordinator_epoch
        self.loaded = False
        self.transactions: dict[str, TransactionMetadata] = {}
        self.pending: dict[str, TransactionMetadata | None] = {}

    # -- loading (replay of the transaction log) ----------------------------------------------

    def load(self, records: Iterable[tuple[str, TransactionMetadata | None]]) -> list[Effect]:
        """Replay records in log order; returns the effects that finish what the previous
        coordinator left: markers for every PrepareCommit / PrepareAbort (rolled forward)."""
        for txn_id, metadata in records:
            self._replay_metadata(txn_id, metadata)
        return self.loaded_effects()

    def replay(self, offset: int, producer_id: int | None, record: Record) -> None:
        """One record of the transaction log partition (the runtime's replay); a record that
        cannot be read is skipped."""
        try:
            txn_id = decode_key(record.key or b"")
            metadata = None if record.value is None else decode_value(txn_id, record.value)
        except TxnLogFormatError as exc:
            log.error("skipping a bad transaction log record at offset %d: %s", offset, exc)
            return
        self._replay_metadata(txn_id, metadata)

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        """The transaction log has no markers of its own: nothing to do."""

    def _replay_metadata(self, txn_id: str, metadata: TransactionMetadata | None) -> None:
        if metadata is None:
            self.transactions.pop(txn_id, None)
        else:
            self.transactions[txn_id] = metadata

    def loaded_effects(self) -> list[Effect]:
        """The replay is done: the effects that finish what the previous coordinator left,
        markers for every PrepareCommit / PrepareAbort (rolled forward)."""
        self.loaded = True
        return [self._markers(m) for m in self.transactions.values()
                if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)]

    # -- the write-ahead of every change ------------------------------------------------------

    def _stage(self, new: TransactionMetadata) -> WriteTxnLog:
        self.pending[new.transactional_id] = new
        return WriteTxnLog(new.transactional_id, new)

    def write_done(self, transactional_id: str, ok: bool) -> list[Effect]:
        """The record staged for ``transactional_id`` was appended (or not). Returns what
        follows: the markers once a PrepareCommit / PrepareAbort is durable."""
        new = self.pending.pop(transactional_id)
        if not ok:
            current = self.transactions.get(transactional_id)
            if (new is not None and current is not None
                    and current.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)
                    and new.state in (S.COMPLETE_COMMIT, S.COMPLETE_ABORT)):
                # The markers are written; only the completion's record is missing, and no
                # request can finish the transaction for it (the client's retries are
                # answered CONCURRENT_TRANSACTIONS, a prepared transaction never times out).
                # Write it again, after a pause, for as long as this is the coordinator (as
                # Kafka's marker channel manager retries its log appends); a new coordinator
                # rolls the prepared transaction forward itself.
                return [Pause(COMPLETE_RETRY_MS), self._stage(new)]
            return []
        if new is None:
            self.transactions.pop(transactional_id, None)
            return []
        self.transactions[transactional_id] = new
        if new.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return [self._markers(new)]
        return []

    def _markers(self, m: TransactionMetadata) -> SendMarkers:
        # Transaction version 2: the markers carry an epoch newer than the transaction's, and
        # say so (the partitions then refuse a marker that is not newer, KAFKA-17754) -- unless
        # the coordinator's abort found the epoch exhausted and kept it (_fence_and_abort):
        # those markers are at the transaction's own epoch, as before KIP-890.
        bumped = (m.last_producer_id, m.last_producer_epoch) != (m.producer_id, m.producer_epoch)
        return SendMarkers(m.transactional_id, m.producer_id, m.producer_epoch,
                           m.state == S.PREPARE_COMMIT, m.partitions, self.coordinator_epoch,
                           m.client_txn_version if bumped else 0)

    def markers_done(self, transactional_id: str, now_ms: int) -> list[Effect]:
        """Every marker of the prepared transaction is written: complete it (step 5.3)."""
        m = self.transactions.get(transactional_id)
        if m is None or m.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return []
        final = S.COMPLETE_COMMIT if m.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        # Transaction version 2: from now on the client's next id and epoch are the current.
        # The start time stays (Kafka's prepareComplete keeps txnStartTimestamp: a completed
        # transaction is described with the time it began); InitProducerId clears it.
        pid, epoch = m.client_identity
        return [self._stage(m.transition_to(final, now_ms, partitions=frozenset(),
                                            producer_id=pid,
                                            producer_epoch=epoch, next_producer_id=-1,
                                            next_producer_epoch=-1))]

    # -- checks shared by the requests --------------------------------------------------------

    def _busy(self, transactional_id: str) -> ErrorCode | None:
        if not self.loaded:
            return ErrorCode.coordinator_load_in_progress
        if transactional_id in self.pending:
            return ErrorCode.concurrent_transactions
        return None

    def _current(self, api: str, version: int, transactional_id: str, producer_id: int,
                 producer_epoch: int) -> tuple[ErrorCode | None, TransactionMetadata | None]:
        busy = self._busy(transactional_id)
        if busy:
            return busy, None
        m = self.transactions.get(transactional_id)
        if m is not None and m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT) \
                and (producer_id, producer_epoch) == m.client_identity \
                and (producer_id, producer_epoch) != (m.producer_id, m.producer_epoch):
            # The client's next transaction, early: the last one's markers still go out under
            # that transaction's own id and epoch (a kept two-phase-commit transaction, an
            # epoch overflow), while the client already holds its next ones. Busy, not fenced.
            return ErrorCode.concurrent_transactions, None
        if m is None or m.producer_id != producer_id:
            return ErrorCode.invalid_producer_id_mapping, None
        if producer_epoch != m.producer_epoch:
            return _fenced(api, version), None
        return None, m

    # -- InitProducerId (step 2) ----------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, now_ms: int, *,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1,
                         version: int = 4, enable_2pc: bool = False,
                         keep_prepared_txn: bool = False) -> Outcome:
        if enable_2pc:
            if not self.two_phase_commit_enabled:
                # KIP-939: transaction.two.phase.commit.enable is off on this broker.
                return Outcome(ErrorCode.transactional_id_authorization_failed)
            timeout_ms = TWO_PHASE_TIMEOUT  # never times out; the request's value is ignored
        elif not 0 < timeout_ms <= self.max_timeout_ms:
            return Outcome(ErrorCode.invalid_transaction_timeout)
        busy = self._busy(transactional_id)
        if busy:
            return Outcome(busy)
        m = self.transactions.get(transactional_id)
        if m is None:
            new = TransactionMetadata(transactional_id, self.allocate_producer_id(), 0,
                                      timeout_ms, S.EMPTY, txn_last_update_ms=now_ms)
            return Outcome(None, new.producer_id, 0, [self._stage(new)])
        if producer_id != NO_PRODUCER_ID:
            # KIP-360: the caller says which producer it is. A retry of an InitProducerId that
            # already bumped is answered with the result; anyone else is a zombie.
            if (producer_id, producer_epoch) == (m.last_producer_id, m.last_producer_epoch) \
                    and m.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                if m.state == S.EMPTY:
                    return Outcome(None, m.producer_id, m.producer_epoch)
                # Kafka's prepareIncrementProducerEpoch: the epoch the coordinator bumped to
                # (an EndTxn of transaction version 2, an abort that fenced the caller at
                # transaction version 2) is answered without another bump.
                new = m.transition_to(S.EMPTY, now_ms, txn_timeout_ms=timeout_ms,
                                      partitions=frozenset(), txn_start_ms=-1)
                return Outcome(None, new.producer_id, new.producer_epoch, [self._stage(new)])
            if (producer_id, producer_epoch) != m.client_identity:
                if producer_id == m.producer_id and m.state in (
                        S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
                    # Kafka checks the producer id, then a transition in progress, and the
                    # epoch only after it: the retry of an InitProducerId that fenced its own
                    # transaction, while the abort's markers are written, waits as well.
                    return Outcome(ErrorCode.concurrent_transactions)
                return Outcome(_fenced("init_producer_id", version))
        if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
            return Outcome(ErrorCode.concurrent_transactions)  # the client retries once completed
        if m.state == S.ONGOING and keep_prepared_txn:
            # KIP-939: a restarted participant keeps its prepared transaction (its id and epoch
            # stay, for the markers) and gets an id and epoch of its own, newer than any of
            # the earlier incarnations', which are fenced from now on.
            next_pid, next_epoch = self._bumped(*m.client_identity)
            new = m.transition_to(S.ONGOING, now_ms, next_producer_id=next_pid,
                                  next_producer_epoch=next_epoch,
                                  txn_timeout_ms=timeout_ms if enable_2pc else m.txn_timeout_ms)
            return Outcome(None, next_pid, next_epoch, [self._stage(new)],
                           ongoing_producer_id=m.producer_id,
                           ongoing_producer_epoch=m.producer_epoch)
        if m.state == S.ONGOING:
            # Fence the previous instance: bump the epoch and abort its transaction with it,
            # so that every partition learns the new epoch from the ABORT marker. The caller
            # retries (CONCURRENT_TRANSACTIONS) and then gets the next epoch.
            return Outcome(ErrorCode.concurrent_transactions, effects=[self._fence_and_abort(m, now_ms)])
        # Empty, CompleteCommit, CompleteAbort: a new epoch (or a new id once exhausted).
        if m.epoch_exhausted:
            new_pid, new_epoch = self.allocate_producer_id(), 0
        else:
            new_pid, new_epoch = m.producer_id, m.producer_epoch + 1
        new = m.transition_to(S.EMPTY, now_ms, producer_id=new_pid, producer_epoch=new_epoch,
                              txn_timeout_ms=timeout_ms, partitions=frozenset(),
                              txn_start_ms=-1, last_producer_id=m.producer_id,
                              last_producer_epoch=m.producer_epoch, next_producer_id=-1,
                              next_producer_epoch=-1)
        return Outcome(None, new_pid, new_epoch, [self._stage(new)])

    def _bumped(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """The id and epoch after ``producer_epoch`` + 1, or a new id (epoch 0) when that
        would reach the maximum epoch (kept for the markers of the last transaction)."""
        if producer_epoch + 1 < MAX_PRODUCER_EPOCH:
            return producer_id, producer_epoch + 1
        return self.allocate_producer_id(), 0

    def _fence_and_abort(self, m: TransactionMetadata, now_ms: int) -> WriteTxnLog:
        fenced = m.transition_to(S.PREPARE_EPOCH_FENCE, now_ms)
        epoch = m.producer_epoch if m.epoch_exhausted else m.producer_epoch + 1
        # Below transaction version 2 no earlier request may be taken for a retry once the
        # coordinator itself aborted. At version 2 Kafka's abort keeps the epoch the producer
        # held as the last one: that producer's InitProducerId (KIP-360) gets the bumped epoch.
        last_pid, last_epoch = m.client_identity if self.transaction_version >= 2 else (-1, -1)
        return self._stage(fenced.transition_to(S.PREPARE_ABORT, now_ms, producer_epoch=epoch,
                                                next_producer_id=-1, next_producer_epoch=-1,
                                                last_producer_id=last_pid,
                                                last_producer_epoch=last_epoch))

    # -- AddPartitionsToTxn / AddOffsetsToTxn (steps 4.1, 4.3) ------------------------------

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]], now_ms: int, *,
                       version: int = 3, api: str = "add_partitions",
                       txn_version: int | None = None) -> Outcome:
        """Add partitions: asked by the client (transaction version 0/1), or by the partition
        leader on the client's first write to a partition (``txn_version`` 2, KIP-890)."""
        error, m = self._current(api, version, transactional_id, producer_id, producer_epoch)
        if error or m is None:
            return Outcome(error)
        if m.next_producer_id >= 0 and m.state == S.ONGOING:
            # A kept two-phase-commit transaction takes nothing more (KIP-939: only commit or
            # abort); its earlier incarnations are fenced.
            return Outcome(_fenced(api, version))
        if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return Outcome(ErrorCode.concurrent_transactions)
        if m.state not in (S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return Outcome(ErrorCode.invalid_txn_state)
        wanted = frozenset(partitions)
        if m.state == S.ONGOING and wanted <= m.partitions:
            return Outcome(None, m.producer_id, m.producer_epoch)
        start = m.txn_start_ms if m.state == S.ONGOING else now_ms
        changes = {} if txn_version is None else {"client_txn_version": txn_version}
        new = m.transition_to(S.ONGOING, now_ms, partitions=m.partitions | wanted,
                              txn_start_ms=start, **changes)
        return Outcome(None, m.producer_id, m.producer_epoch, [self._stage(new)])

    def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                          partitions: Iterable[tuple[str, int]], *, version: int = 4
                          ) -> dict[tuple[str, int], ErrorCode | None]:
        """KIP-890 part 1 (AddPartitionsToTxn v4+ with verifyOnly): is the transaction ongoing
        with this producer id and epoch, and does it include each partition? Changes nothing."""
        wanted = list(partitions)
        error, m = self._current("add_partitions", version, transactional_id, producer_id,
                                 producer_epoch)
        if error or m is None:
            return {tp: error for tp in wanted}
        return {tp: None if m.state == S.ONGOING and tp in m.partitions else ErrorCode.invalid_txn_state
                for tp in wanted}

    # -- EndTxn (step 5.1) ----------------------------------------------------------------------

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, now_ms: int, *, version: int = 3, txn_version: int = 0) -> Outcome:
        if txn_version >= 2:
            return self._end_txn_v2(transactional_id, producer_id, producer_epoch, commit,
                                    now_ms, version)
        error, m = self._current("end_txn", version, transactional_id, producer_id,
                                 producer_epoch)
        if error or m is None:
            return Outcome(error)
        same_way = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        preparing = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if m.state == same_way:
            return Outcome(None, m.producer_id, m.producer_epoch)  # a retry: it is done
        if m.state == preparing:
            return Outcome(ErrorCode.concurrent_transactions)  # a retry while markers are written
        if m.state != S.ONGOING:
            return Outcome(ErrorCode.invalid_txn_state)
        new = m.transition_to(preparing, now_ms, client_txn_version=txn_version)
        return Outcome(None, m.producer_id, m.producer_epoch, [self._stage(new)])

    def _end_txn_v2(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    commit: bool, now_ms: int, version: int) -> Outcome:
        """KIP-890 part 2: every commit and abort bumps the epoch."""
        busy = self._busy(transactional_id)
        if busy:
            return Outcome(busy)
        m = self.transactions.get(transactional_id)
        if m is None:
            return Outcome(ErrorCode.invalid_producer_id_mapping)
        same_way = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        preparing = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        caller = (producer_id, producer_epoch)
        if caller == (m.last_producer_id, m.last_producer_epoch) and m.client_txn_version >= 2:
            # A retry of the EndTxn that bumped: done, or still writing markers.
            if m.state == same_way:
                return Outcome(None, *m.client_identity)
            if m.state == preparing:
                return Outcome(ErrorCode.concurrent_transactions)
        client_pid, client_epoch = m.client_identity
        if producer_id != client_pid:
            known = producer_id >= 0 and producer_id in (m.producer_id, m.last_producer_id)
            return Outcome(_fenced("end_txn", version) if known
                           else ErrorCode.invalid_producer_id_mapping)
        if producer_epoch != client_epoch:
            return Outcome(_fenced("end_txn", version))
        if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
            return Outcome(ErrorCode.concurrent_transactions)
        if m.state != S.ONGOING and (commit or m.state not in (S.EMPTY, S.COMPLETE_COMMIT,
                                                                S.COMPLETE_ABORT)):
            return Outcome(ErrorCode.invalid_txn_state)
        # The markers carry the transaction's own epoch + 1; the client goes on with its
        # own id and epoch + 1, or a new id once that epoch would be the maximum.
        marker_epoch = m.producer_epoch + 1
        next_pid, next_epoch = self._bumped(client_pid, client_epoch)
        if (next_pid, next_epoch) == (m.producer_id, marker_epoch):
            next_pid, next_epoch = -1, -1
        partitions = m.partitions if m.state == S.ONGOING else frozenset()
        new = m.transition_to(preparing, now_ms, producer_epoch=marker_epoch,
                              partitions=partitions, last_producer_id=client_pid,
                              last_producer_epoch=client_epoch, next_producer_id=next_pid,
                              next_producer_epoch=next_epoch, client_txn_version=2)
        return Outcome(None, *new.client_identity, effects=[self._stage(new)])

    # -- timers -------------------------------------------------------------------------------

    def abort_timed_out(self, now_ms: int) -> list[Effect]:
        """Transactions open past their timeout are aborted with a bumped epoch, so that the
        producer that let them run is fenced (a zombie, as spec 001 scenario 3 describes)."""
        return [self._fence_and_abort(m, now_ms) for txn_id, m in list(self.transactions.items())
                if m.state == S.ONGOING and txn_id not in self.pending and not m.two_phase
                and now_ms - m.txn_start_ms > m.txn_timeout_ms]

    def expire(self, now_ms: int) -> list[Effect]:
        """transactional.id.expiration.ms: forget ids idle that long (a tombstone)."""
        out: list[Effect] = []
        for txn_id, m in list(self.transactions.items()):
            if txn_id in self.pending or m.state not in (S.EMPTY, S.COMPLETE_COMMIT,
                                                         S.COMPLETE_ABORT):
                continue
            if now_ms - m.txn_last_update_ms >= self.expiration_ms:
                self.pending[txn_id] = None
                out.append(WriteTxnLog(txn_id, None))
        return out

    # -- views --------------------------------------------------------------------------------

    def longest_open_ms(self, now_ms: int) -> int:
        """KIP-939's active-transaction-open-time-max: how long the oldest open transaction
        has been open (0 when none is)."""
        return max((now_ms - m.txn_start_ms for m in self.transactions.values()
                    if m.state == S.ONGOING and m.txn_start_ms >= 0), default=0)

    def describe(self, transactional_id: str) -> TransactionMetadata | None:
        return self.transactions.get(transactional_id)

    def list(self, states: set[TransactionState] | None = None,
             producer_ids: set[int] | None = None, min_duration_ms: int = -1,
             now_ms: int = 0) -> list[TransactionMetadata]:
        out = []
        for m in self.transactions.values():
            if states and m.state not in states:
                continue
            if producer_ids and m.producer_id not in producer_ids:
                continue
            if min_duration_ms >= 0 and (m.state != S.ONGOING
                                         or now_ms - m.txn_start_ms < min_duration_ms):
                continue
            out.append(m)
        return out


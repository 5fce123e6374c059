"""The transaction coordinator, sans IO (spec 000, "Transaction Coordinator", Data Flow steps
2, 4.1, 4.3, 5.1-5.3; KIP-360 for InitProducerId with the current producer id and epoch).

It takes requests and the current time and returns an ``Outcome``: an error name or the
answer, and the effects to carry out, in order. Effects are ``WriteTxnLog`` (append this record
to the transaction log; report back with ``write_done``) and ``SendMarkers`` (write these
COMMIT/ABORT markers; report back with ``markers_done``). A state change becomes visible only
once its record is written: until then the transactional id has a pending change, and requests
for it answer CONCURRENT_TRANSACTIONS. server/txn_service.py carries the effects out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .state import TransactionMetadata, TransactionState

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


Effect = WriteTxnLog | SendMarkers


@dataclass
class Outcome:
    error: str | None = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    effects: list[Effect] = field(default_factory=list)


def _fenced(api: str, version: int) -> str:
    return "producer_fenced" if version >= PRODUCER_FENCED_SINCE[api] else \
        "invalid_producer_epoch"


class TransactionCoordinator:
    def __init__(self, *, allocate_producer_id: Callable[[], int], max_timeout_ms: int,
                 expiration_ms: int, coordinator_epoch: int = 0) -> None:
        self.allocate_producer_id = allocate_producer_id
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
            if metadata is None:
                self.transactions.pop(txn_id, None)
            else:
                self.transactions[txn_id] = metadata
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
            return []
        if new is None:
            self.transactions.pop(transactional_id, None)
            return []
        self.transactions[transactional_id] = new
        if new.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return [self._markers(new)]
        return []

    def _markers(self, m: TransactionMetadata) -> SendMarkers:
        return SendMarkers(m.transactional_id, m.producer_id, m.producer_epoch,
                           m.state == S.PREPARE_COMMIT, m.partitions, self.coordinator_epoch)

    def markers_done(self, transactional_id: str, now_ms: int) -> list[Effect]:
        """Every marker of the prepared transaction is written: complete it (step 5.3)."""
        m = self.transactions.get(transactional_id)
        if m is None or m.state not in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return []
        final = S.COMPLETE_COMMIT if m.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return [self._stage(m.transition_to(final, now_ms, partitions=frozenset(),
                                            txn_start_ms=-1))]

    # -- checks shared by the requests --------------------------------------------------------

    def _busy(self, transactional_id: str) -> str | None:
        if not self.loaded:
            return "coordinator_load_in_progress"
        if transactional_id in self.pending:
            return "concurrent_transactions"
        return None

    def _current(self, api: str, version: int, transactional_id: str, producer_id: int,
                 producer_epoch: int) -> tuple[str | None, TransactionMetadata | None]:
        busy = self._busy(transactional_id)
        if busy:
            return busy, None
        m = self.transactions.get(transactional_id)
        if m is None or m.producer_id != producer_id:
            return "invalid_producer_id_mapping", None
        if producer_epoch != m.producer_epoch:
            return _fenced(api, version), None
        return None, m

    # -- InitProducerId (step 2) ----------------------------------------------------------------

    def init_producer_id(self, transactional_id: str, timeout_ms: int, now_ms: int, *,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1,
                         version: int = 4) -> Outcome:
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return Outcome("invalid_transaction_timeout")
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
                    and m.state == S.EMPTY:
                return Outcome(None, m.producer_id, m.producer_epoch)
            if (producer_id, producer_epoch) != (m.producer_id, m.producer_epoch):
                return Outcome(_fenced("init_producer_id", version))
        if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
            return Outcome("concurrent_transactions")  # the client retries once completed
        if m.state == S.ONGOING:
            # Fence the previous instance: bump the epoch and abort its transaction with it,
            # so that every partition learns the new epoch from the ABORT marker. The caller
            # retries (CONCURRENT_TRANSACTIONS) and then gets the next epoch.
            return Outcome("concurrent_transactions", effects=[self._fence_and_abort(m, now_ms)])
        # Empty, CompleteCommit, CompleteAbort: a new epoch (or a new id once exhausted).
        if m.epoch_exhausted:
            new_pid, new_epoch = self.allocate_producer_id(), 0
        else:
            new_pid, new_epoch = m.producer_id, m.producer_epoch + 1
        new = m.transition_to(S.EMPTY, now_ms, producer_id=new_pid, producer_epoch=new_epoch,
                              txn_timeout_ms=timeout_ms, partitions=frozenset(),
                              txn_start_ms=-1, last_producer_id=m.producer_id,
                              last_producer_epoch=m.producer_epoch)
        return Outcome(None, new_pid, new_epoch, [self._stage(new)])

    def _fence_and_abort(self, m: TransactionMetadata, now_ms: int) -> WriteTxnLog:
        fenced = m.transition_to(S.PREPARE_EPOCH_FENCE, now_ms)
        epoch = m.producer_epoch if m.epoch_exhausted else m.producer_epoch + 1
        return self._stage(fenced.transition_to(S.PREPARE_ABORT, now_ms, producer_epoch=epoch))

    # -- AddPartitionsToTxn / AddOffsetsToTxn (steps 4.1, 4.3) ------------------------------

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: Iterable[tuple[str, int]], now_ms: int, *,
                       version: int = 3, api: str = "add_partitions") -> Outcome:
        error, m = self._current(api, version, transactional_id, producer_id, producer_epoch)
        if error or m is None:
            return Outcome(error)
        if m.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return Outcome("concurrent_transactions")
        if m.state not in (S.EMPTY, S.ONGOING, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
            return Outcome("invalid_txn_state")
        wanted = frozenset(partitions)
        if m.state == S.ONGOING and wanted <= m.partitions:
            return Outcome(None, m.producer_id, m.producer_epoch)
        start = m.txn_start_ms if m.state == S.ONGOING else now_ms
        new = m.transition_to(S.ONGOING, now_ms, partitions=m.partitions | wanted,
                              txn_start_ms=start)
        return Outcome(None, m.producer_id, m.producer_epoch, [self._stage(new)])

    # -- EndTxn (step 5.1) ----------------------------------------------------------------------

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                commit: bool, now_ms: int, *, version: int = 3) -> Outcome:
        error, m = self._current("end_txn", version, transactional_id, producer_id,
                                 producer_epoch)
        if error or m is None:
            return Outcome(error)
        same_way = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        preparing = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if m.state == same_way:
            return Outcome(None, m.producer_id, m.producer_epoch)  # a retry: it is done
        if m.state == preparing:
            return Outcome("concurrent_transactions")  # a retry while markers are written
        if m.state != S.ONGOING:
            return Outcome("invalid_txn_state")
        new = m.transition_to(preparing, now_ms)
        return Outcome(None, m.producer_id, m.producer_epoch, [self._stage(new)])

    # -- timers -------------------------------------------------------------------------------

    def abort_timed_out(self, now_ms: int) -> list[Effect]:
        """Transactions open past their timeout are aborted with a bumped epoch, so that the
        producer that let them run is fenced (a zombie, as spec 001 scenario 3 describes)."""
        return [self._fence_and_abort(m, now_ms) for txn_id, m in list(self.transactions.items())
                if m.state == S.ONGOING and txn_id not in self.pending
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


"""The transaction coordinator's states and per-transactional-id metadata (spec 000,
"Transaction Coordinator"; Kafka's TransactionState and TransactionMetadata).

Everything that decides whether a state change is legal lives in this file: each state lists the
states it may be entered from, and ``TransactionMetadata.transition_to`` is the one place that
checks it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

MAX_PRODUCER_EPOCH = 32767  # int16; at MAX - 1 a bump would exhaust it: a new id is taken
# KIP-939: the timeout of a transaction that never times out, as Kafka stores and describes it
# (Integer.MAX_VALUE); oncelog stored -1 before, which still reads as such.
TWO_PHASE_TIMEOUT = 2**31 - 1
_OLD_TWO_PHASE_TIMEOUT = -1


class TransactionState(enum.Enum):
    # value: (wire id in the transaction log, the name DescribeTransactions shows)
    EMPTY = (0, "Empty")
    ONGOING = (1, "Ongoing")
    PREPARE_COMMIT = (2, "PrepareCommit")
    PREPARE_ABORT = (3, "PrepareAbort")
    COMPLETE_COMMIT = (4, "CompleteCommit")
    COMPLETE_ABORT = (5, "CompleteAbort")
    DEAD = (6, "Dead")
    PREPARE_EPOCH_FENCE = (7, "PrepareEpochFence")

    @property
    def id(self) -> int:
        return self.value[0]

    @property
    def display(self) -> str:
        return self.value[1]

    @classmethod
    def from_id(cls, state_id: int) -> TransactionState:
        for s in cls:
            if s.id == state_id:
                return s
        raise ValueError(f"unknown transaction state id {state_id}")

    @classmethod
    def from_display(cls, name: str) -> TransactionState | None:
        for s in cls:
            if s.display.lower() == name.lower():
                return s
        return None

    @property
    def is_completed(self) -> bool:
        return self in (TransactionState.COMPLETE_COMMIT, TransactionState.COMPLETE_ABORT)


S = TransactionState
# spec 000 / Kafka: the states each state may be entered from.
VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # KIP-890 transaction version 2: an abort with nothing open still bumps the epoch.
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE, S.EMPTY, S.COMPLETE_COMMIT,
                                S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}


class IllegalTransitionError(Exception):
    pass


@dataclass(frozen=True)
class TransactionMetadata:
    """What the coordinator knows of one transactional id; one ``__transaction_state`` record
    holds all of it. Immutable: a transition returns the next version."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState = S.EMPTY
    partitions: frozenset[tuple[str, int]] = field(default_factory=frozenset)
    txn_start_ms: int = -1
    txn_last_update_ms: int = -1
    # The producer id and epoch the client held before the last bump: a retried
    # InitProducerId (KIP-360) or EndTxn (KIP-890 transaction version 2) that carries them is
    # answered with the current ones instead of being fenced (Kafka's PrevProducerId).
    last_producer_id: int = -1
    last_producer_epoch: int = -1
    # The identity the client uses next when it differs from (producer_id, producer_epoch):
    # after an epoch overflow while a transaction completes (KIP-890), and for a prepared
    # two-phase-commit transaction kept across a restart (KIP-939: the transaction's own id
    # and epoch stay in producer_id / producer_epoch, the new incarnation's are these).
    next_producer_id: int = -1
    next_producer_epoch: int = -1
    # The transaction version the client ended its last transaction with (KIP-890: 2 means
    # an epoch bump on every commit and abort).
    client_txn_version: int = 0

    def transition_to(self, state: TransactionState, now_ms: int, **changes) -> TransactionMetadata:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransitionError(
                f"transactional id {self.transactional_id!r}: {self.state.display} -> "
                f"{state.display} is not a valid transition")
        return replace(self, state=state, txn_last_update_ms=now_ms, **changes)

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_PRODUCER_EPOCH - 1

    @property
    def two_phase(self) -> bool:
        """A two-phase-commit participant's transaction (KIP-939): it never times out; its
        timeout is stored as Integer.MAX_VALUE (by oncelog before: -1)."""
        return self.txn_timeout_ms in (TWO_PHASE_TIMEOUT, _OLD_TWO_PHASE_TIMEOUT)

    @property
    def client_identity(self) -> tuple[int, int]:
        """The producer id and epoch the client must present now."""
        if self.next_producer_id >= 0:
            return self.next_producer_id, self.next_producer_epoch
        return self.producer_id, self.producer_epoch

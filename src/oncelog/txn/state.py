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
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
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
    # The producer id and epoch before the last bump: a retried InitProducerId (KIP-360)
    # that carries them is answered with the current ones instead of being fenced.
    last_producer_id: int = -1
    last_producer_epoch: int = -1

    def transition_to(self, state: TransactionState, now_ms: int, **changes) -> TransactionMetadata:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalTransitionError(
                f"transactional id {self.transactional_id!r}: {self.state.display} -> "
                f"{state.display} is not a valid transition")
        return replace(self, state=state, txn_last_update_ms=now_ms, **changes)

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= MAX_PRODUCER_EPOCH - 1

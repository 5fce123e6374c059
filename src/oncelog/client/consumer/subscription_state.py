"""Which partitions a consumer reads and where it stands in each (aiokafka's
subscription_state, the Java SubscriptionState).

A partition's position is the offset of the next record ``poll`` will return. It is unknown
right after ``assign`` and after ``seek_to_beginning``/``seek_to_end``; such a partition carries
a reset strategy ("earliest" or "latest") that the consumer resolves with ListOffsets before it
fetches, lazily, as the Java client does: ``seek_to_end`` means the end at the next ``poll`` or
``position``, not at the moment of the call.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..types import TopicPartition

EARLIEST = "earliest"
LATEST = "latest"


@dataclass
class PartitionState:
    position: int | None = None
    reset_strategy: str | None = None  # EARLIEST / LATEST while the position is to be looked up
    high_watermark: int = -1
    last_stable_offset: int = -1
    paused: bool = False  # Consumer.pause: not fetched, its buffered records not returned


class SubscriptionState:
    def __init__(self, default_reset: str) -> None:
        self.default_reset = default_reset  # auto.offset.reset: earliest, latest or none
        self._assignment: dict[TopicPartition, PartitionState] = {}

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Replace the assignment; partitions kept keep their positions."""
        old = self._assignment
        self._assignment = {tp: old.get(tp) or PartitionState() for tp in partitions}

    def assigned(self) -> list[TopicPartition]:
        return list(self._assignment)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._assignment

    def state(self, tp: TopicPartition) -> PartitionState:
        try:
            return self._assignment[tp]
        except KeyError:
            raise ValueError(f"partition {tp.topic}-{tp.partition} is not assigned") from None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        state = self.state(tp)
        state.position = offset
        state.reset_strategy = None

    def request_reset(self, tp: TopicPartition, strategy: str) -> None:
        state = self.state(tp)
        state.position = None
        state.reset_strategy = strategy

    def needing_position(self) -> list[TopicPartition]:
        return [tp for tp, s in self._assignment.items() if s.position is None]

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, s in self._assignment.items()
                if s.position is not None and not s.paused]

    def pause(self, tp: TopicPartition) -> None:
        self.state(tp).paused = True

    def resume(self, tp: TopicPartition) -> None:
        self.state(tp).paused = False

    def is_paused(self, tp: TopicPartition) -> bool:
        state = self._assignment.get(tp)
        return state is not None and state.paused

    def paused(self) -> list[TopicPartition]:
        return [tp for tp, s in self._assignment.items() if s.paused]

    def position(self, tp: TopicPartition) -> int | None:
        return self.state(tp).position

"""One partition's log on disk: segments, indexes, recovery, retention, producer state."""

from .leader_epoch import EpochEntry, LeaderEpochCache
from .log import (
    AppendResult,
    FollowerAppendResult,
    LogAppendError,
    LogConfig,
    LogWriteError,
    OffsetOutOfRangeError,
    PartitionLog,
    UnexpectedAppendOffsetError,
)
from .producer_state import ProducerStateError, ProducerStateManager

__all__ = [
    "AppendResult",
    "EpochEntry",
    "FollowerAppendResult",
    "LeaderEpochCache",
    "LogAppendError",
    "LogConfig",
    "LogWriteError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ProducerStateError",
    "ProducerStateManager",
    "UnexpectedAppendOffsetError",
]

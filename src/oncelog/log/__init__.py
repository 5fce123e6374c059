"""One partition's log on disk: segments, indexes, recovery, retention, producer state."""

from .log import (
    AppendResult,
    LogAppendError,
    LogConfig,
    LogWriteError,
    OffsetOutOfRangeError,
    PartitionLog,
)
from .producer_state import ProducerStateError, ProducerStateManager

__all__ = [
    "AppendResult",
    "LogAppendError",
    "LogConfig",
    "LogWriteError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "ProducerStateError",
    "ProducerStateManager",
]

"""A partition's log opened as the broker opens it, for the log's unit tests (no broker).

``open_log`` is server/topics.py's ``PartitionLog(directory, config, now)``. Every log is a
replica's: an append moves its log end, never its high watermark, which only the replica
manager moves once the in-sync replicas have the data (server/replication.py,
``_maybe_advance_hw``). ``advance_high_watermark`` is that move; with no target it is the one a
leader that is its partition's only in-sync replica (a single node) makes after each append and
when it takes the lead: to the log end. A test calls it where it needs data a consumer can read
(below the high watermark and the last stable offset), and leaves it out to see what is not
committed yet.
"""

from __future__ import annotations

from pathlib import Path

from oncelog.log import LogConfig, PartitionLog
from oncelog.log.preallocator import Preallocator


def open_log(directory: Path | str, config: LogConfig | None = None, now_ms: int = 0,
             preallocator: Preallocator | None = None, **overrides) -> PartitionLog:
    """The log in ``directory``, opened (created, recovered) as the broker opens a partition's
    log: with ``config``, or a LogConfig of ``overrides``."""
    if config is None:
        config = LogConfig(**overrides)
    elif overrides:
        raise TypeError("open_log takes a config or overrides, not both")
    return PartitionLog(Path(directory), config, now_ms, preallocator)


def advance_high_watermark(plog: PartitionLog, to: int | None = None) -> int:
    """Move the high watermark as the replica manager does once the in-sync replicas have the
    log up to ``to`` (default: its end, a lone in-sync replica's case). Returns it."""
    return plog.update_high_watermark(plog.log_end_offset if to is None else to)

"""Which compacted log to clean, and how far (Kafka's LogCleanerManager), sans IO but for the
small checkpoint file each log keeps.

A compacted log's cleanable range runs from its log start to its first uncleanable offset:
the lowest of the last stable offset (a cleaning never decides about an open transaction),
the active segment's base (it is still written) and, with ``min.compaction.lag.ms``, the
first segment holding a record younger than that lag; rounded down to a segment's base, so
that only whole segments are cleaned. The part from the log start to the first dirty offset
(``cleaner-offset-checkpoint``: where the last cleaning's offset map stopped) is clean, the
rest dirty. A log is cleaned when its dirty ratio (dirty bytes / cleanable bytes) exceeds
``min.cleanable.dirty.ratio``, or at once when a dirty segment began longer than
``max.compaction.lag.ms`` ago (KIP-354), or when a delete horizon stamped by an earlier pass
has passed (KIP-534's second pass: oncelog's own trigger; Kafka waits for new dirt). The
filthiest goes first.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .loader import read_offset_file, write_offset_file
from .log_config import MAX_LONG
from .producer_state import ProducerStateManager
from .segment import LogSegment
from .txn_index import AbortedTxn

CHECKPOINT_FILE = "cleaner-offset-checkpoint"


class CompactedLog(Protocol):
    """What choosing and cleaning a log read of log/log.py's PartitionLog (named here, not
    imported: the log does not depend on its cleaner, nor the cleaner on the log's module)."""

    directory: Path
    config: Any  # log.py's LogConfig
    segments: list[LogSegment]
    producer_state: ProducerStateManager
    generation: int

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int
                             ) -> list[AbortedTxn]: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def last_stable_offset(self) -> int: ...


@dataclass
class CleanerState:
    """The cleaner's memory of one log: where the dirty section starts, and the earliest delete
    horizon the last pass stamped (MAX_LONG: none)."""

    first_dirty_offset: int | None = None
    next_horizon_ms: int = MAX_LONG
    in_progress: bool = False
    # A cleaning failed other than by an I/O error (a batch it cannot read): not tried again
    # until the broker restarts (Kafka's uncleanable partitions).
    uncleanable: bool = False


@dataclass
class LogToClean:
    name: str
    log: CompactedLog
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    dirty_bytes: int
    needs_compaction_now: bool
    horizon_due: bool

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


class CleanerManager:
    def __init__(self) -> None:
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def state(self, plog: CompactedLog) -> CleanerState:
        st = self._states.get(plog)
        if st is None:
            st = CleanerState(read_offset_file(plog.directory / CHECKPOINT_FILE))
            self._states[plog] = st
        return st

    def cleanable_offsets(self, plog: CompactedLog, now_ms: int) -> tuple[int, int, bool]:
        """(first dirty offset, first uncleanable offset, whether max.compaction.lag.ms says
        to clean now) of a compacted log."""
        cfg = plog.config
        start, end = plog.log_start_offset, plog.log_end_offset
        checkpoint = self.state(plog).first_dirty_offset
        first_dirty = start if checkpoint is None or not start <= checkpoint <= end \
            else checkpoint
        segments = plog.segments
        limit = min(plog.last_stable_offset, segments[-1].base_offset)
        min_lag = getattr(cfg, "min_compaction_lag_ms", 0)
        max_lag = getattr(cfg, "max_compaction_lag_ms", MAX_LONG)
        dirty = [s for s in segments[:-1] if s.next_offset > first_dirty]
        if min_lag > 0:
            young = [s.base_offset for s in dirty if s.max_timestamp > now_ms - min_lag]
            limit = min([limit, *young])
        # Whole segments only: the range ends at the base of the segment holding the limit.
        first_uncleanable = max((s.base_offset for s in segments if s.base_offset <= limit),
                                default=start)
        first_dirty = min(first_dirty, first_uncleanable)
        needs_now = max_lag < MAX_LONG and any(
            s.first_batch_timestamp is not None and 0 < s.first_batch_timestamp < now_ms - max_lag
            for s in dirty if s.base_offset < first_uncleanable)
        return first_dirty, first_uncleanable, needs_now

    def log_to_clean(self, name: str, plog: CompactedLog, now_ms: int) -> LogToClean:
        first_dirty, first_uncleanable, needs_now = self.cleanable_offsets(plog, now_ms)
        clean = dirty = 0
        for seg in plog.segments[:-1]:
            if seg.base_offset >= first_uncleanable:
                break
            if seg.base_offset < first_dirty:
                clean += seg.size
            else:
                dirty += seg.size
        due = self.state(plog).next_horizon_ms <= now_ms and first_uncleanable > \
            plog.log_start_offset
        return LogToClean(name, plog, first_dirty, first_uncleanable, clean, dirty,
                          needs_now, due)

    def grab_filthiest(self, logs, now_ms: int) -> LogToClean | None:
        """The compacted log most in need of cleaning among ``logs`` ((name, log) pairs), or
        None; it is marked in progress until ``done_cleaning``."""
        best: LogToClean | None = None
        for name, plog in logs:
            if not plog.config.compact:
                continue  # before the state: a delete-only log costs nothing here
            st = self.state(plog)
            if st.in_progress or st.uncleanable:
                continue
            ltc = self.log_to_clean(name, plog, now_ms)
            eligible = (ltc.needs_compaction_now and ltc.dirty_bytes > 0) or ltc.horizon_due \
                or (ltc.dirty_bytes > 0
                    and ltc.cleanable_ratio > plog.config.min_cleanable_dirty_ratio)
            if not eligible:
                continue
            key = (ltc.needs_compaction_now or ltc.horizon_due, ltc.cleanable_ratio)
            if best is None or key > (best.needs_compaction_now or best.horizon_due,
                                      best.cleanable_ratio):
                best = ltc
        if best is not None:
            self.state(best.log).in_progress = True
        return best

    def mark_uncleanable(self, plog: CompactedLog) -> None:
        st = self.state(plog)
        st.in_progress = False
        st.uncleanable = True

    def done_cleaning(self, plog: CompactedLog, end_offset: int | None,
                      next_horizon_ms: int) -> None:
        """A cleaning of ``plog`` ended: with ``end_offset`` (it succeeded) the dirty section
        starts there now, and the checkpoint file says so."""
        st = self.state(plog)
        st.in_progress = False
        if end_offset is None:
            return
        st.first_dirty_offset = end_offset
        st.next_horizon_ms = next_horizon_ms
        try:
            write_offset_file(plog.directory / CHECKPOINT_FILE, end_offset)
        except OSError:
            pass  # the log was deleted meanwhile; a missing checkpoint only means more work

"""The log start offset (KIP-107): the first offset a partition's log serves.

It starts as the first segment's base offset and moves forward when DeleteRecords asks (on the
leader; a follower takes its leader's from each Fetch response) or when retention deletes the
first segments. Below it nothing is read (Fetch answers OFFSET_OUT_OF_RANGE), ListOffsets'
earliest (-2) answers it, and retention deletes the segments wholly below it; the producer
state is kept (Kafka >= 2.5), so that a producer whose records were all deleted carries on with
its next sequence number. It is kept in ``log-start-offset``
beside the segments (Kafka keeps one ``log-start-offset-checkpoint`` per log directory; the
other checkpoints of this log, ``high-watermark`` and ``recovery-point``, are per partition
too), written before DeleteRecords is answered, so that a restart starts the log there again.

Functions over log/log.py's PartitionLog (passed in, not imported: the log imports this module);
they run on the broker's event loop like the log.
"""

from __future__ import annotations

from typing import Any

from .loader import RECOVERY_POINT_FILE, read_offset_file, snapshot_files, write_offset_file
from .producer_state import ProducerStateManager
from .segment import LogSegment

LOG_START_OFFSET_FILE = "log-start-offset"


def load_log_start_offset(plog: Any) -> int:
    """The stored log start offset, kept within the segments there are: never below the first
    segment's base offset (retention may have deleted further since it was written) nor past
    the log end (a tail lost in a crash)."""
    stored = read_offset_file(plog.directory / LOG_START_OFFSET_FILE) or 0
    first = plog.segments[0].base_offset
    return max(first, min(stored, plog.segments[-1].next_offset))


def increment_log_start_offset(plog: Any, offset: int, now_ms: int) -> bool:
    """Move the log start forward to ``offset`` (Kafka's maybeIncrementLogStartOffset); False
    when it is there already. The caller has checked ``offset`` against the high watermark
    (a leader) or clamped it (a follower). The leader-epoch cache is cut to it. The producer
    state is kept, as Kafka keeps it since 2.5 (KIP-360): a producer whose every record was
    deleted carries on with its next sequence number instead of failing with
    UNKNOWN_PRODUCER_ID; producers go only when they expire (producer.id.expiration.ms)."""
    if offset <= plog.log_start_offset:
        return False
    plog._log_start_offset = offset
    write_offset_file(plog.directory / LOG_START_OFFSET_FILE, offset)
    plog.leader_epoch_cache.truncate_from_start(offset)
    plog._high_watermark = max(plog._high_watermark, offset)
    plog.producer_state.on_high_watermark_updated(plog._high_watermark)
    return True


def after_segments_deleted(plog: Any) -> None:
    """Retention deleted the first segments: the log starts at the first left at least."""
    first = plog.segments[0].base_offset
    if plog._log_start_offset < first:
        plog._log_start_offset = first
        write_offset_file(plog.directory / LOG_START_OFFSET_FILE, first)


def after_truncation(plog: Any) -> None:
    """A follower cut its tail: a log start past the new end comes back to it (Kafka's truncateTo
    lowers the log start to the truncation offset), never below the first segment."""
    end = plog.log_end_offset
    if plog._log_start_offset > end:
        plog._log_start_offset = max(plog.segments[0].base_offset, end)
        write_offset_file(plog.directory / LOG_START_OFFSET_FILE, plog._log_start_offset)


def breached_segments(plog: Any) -> int:
    """How many of the first segments lie wholly below the log start (Kafka's
    deleteLogStartOffsetBreachedSegments: those whose next segment starts at or below it);
    never the active segment."""
    n = 0
    segments = plog.segments
    while n + 1 < len(segments) and segments[n + 1].base_offset <= plog.log_start_offset:
        n += 1
    return n


def truncate_fully_and_start_at(plog: Any, offset: int, now_ms: int) -> None:
    """A follower whose log ends below its leader's log start (Kafka's truncateFullyAndStartAt):
    every segment, producer snapshot and leader-epoch entry goes, and the log starts again,
    empty, at ``offset``; its high watermark and recovery point start there too."""
    for seg in plog.segments:
        seg.delete()
    plog.segments.clear()
    seg = LogSegment(plog.directory, offset, plog.config.index_interval_bytes, now_ms)
    plog.segments.append(seg)  # before load: a failed load must still close its file
    seg.load(recover=True)
    for _off, path in snapshot_files(plog.directory):
        path.unlink(missing_ok=True)
    plog.producer_state = ProducerStateManager()
    plog.leader_epoch_cache.clear()
    plog.unflushed_messages = 0
    plog._log_start_offset = offset
    write_offset_file(plog.directory / LOG_START_OFFSET_FILE, offset)
    write_offset_file(plog.directory / RECOVERY_POINT_FILE, offset)
    plog._high_watermark = offset
    plog._write_high_watermark()

"""One partition's log on disk: an ordered list of segments in ``<topic>-<partition>/``.

Owns offset assignment, rolling, retention, flushing, recovery of a torn tail after a crash,
and the partition's producer state (validated before every append, snapshotted to
``<20-digit offset>.snapshot`` files, rebuilt from the log when those are missing or damaged),
with its transactions: COMMIT/ABORT markers, the last stable offset and the aborted-transaction
index (spec 000, "Last Stable Offset Tracking", "Aborted Transaction Index").
Replication (docs/cluster.md, Kafka's ISR protocol): every log is a replica's. It keeps a stored
high watermark (``high-watermark``) that only its owner moves (``update_high_watermark``: the
replica manager, once the in-sync replicas have the data; an append never does, a single node's
included, whose ISR is itself), and a leader-epoch cache (``leader-epoch-checkpoint``,
log/leader_epoch.py). A leader stamps its epoch into the batches it appends; a follower appends
the leader's batches unchanged (``append_as_follower``) and rebuilds the same producer state,
open transactions and aborted-transaction index from them; ``truncate_to`` cuts a diverged tail.
Opening it (segments, recovery, the epoch cache, the producer state, the checkpoint files) is
log/loader.py, Kafka's LogLoader. Single-threaded: the broker's event loop is the only caller.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from kio.schema.errors import ErrorCode

from ..records.batch import (
    ATTR_CONTROL,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    HEADER_SIZE,
    INT32_MAX,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    build_control_batch,
    decode_batch,
    iter_batches,
    parse_control_record,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    split_batches,
    validate_batch,
)
from ..records.region import FileRegion
from . import log_start
from .append_origin import AppendOrigin
from .loader import (
    CLEAN_SHUTDOWN_FILE,
    HIGH_WATERMARK_FILE,
    RECOVERY_POINT_FILE,
    load_leader_epoch_cache,
    load_producer_state,
    load_segments,
    read_high_watermark,
    read_offset_file,
    snapshot_files,
    write_offset_file,
)
from .log_config import LogConfig
from .preallocator import Preallocator
from .producer_state import (
    BatchMetadata,
    CompletedTxn,
    ProducerStateError,
    ProducerStateManager,
    VerificationGuard,
)
from .segment import LogSegment, LogWriteError, os_error_name, segment_name
from .txn_index import AbortedTxn
from .validator import RecordsError, convert_compression, validate_records

SNAPSHOTS_TO_KEEP = 2  # spec 000, "PID Snapshots": keep the two most recent
# Kafka's replica.high.watermark.checkpoint.interval.ms: how often maintenance writes a moved
# high watermark (a flush, a roll and a clean close always do). Writing every partition's file
# every second held the event loop for long on a busy disk, and longer with every partition.
HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS = 5_000
_OFFSET_LENGTH = struct.Struct(">qi")

log = logging.getLogger("oncelog.log")

__all__ = [
    "AbortedTxn",
    "AppendResult",
    "FollowerAppendResult",
    "LogAppendError",
    "LogConfig",
    "LogWriteError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "UnexpectedAppendOffsetError",
]


class LogAppendError(Exception):
    """An append the log refuses; ``error_name`` is the Kafka error code (ErrorCode)."""

    def __init__(self, error_name: ErrorCode, message: str,
                 record_errors: tuple[tuple[int, str], ...] = ()) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.record_errors = record_errors  # (batch index, message): KIP-467


class UnexpectedAppendOffsetError(LogAppendError):
    """A follower append whose batches do not continue the log at its end (a gap, or a batch
    that overlaps the log's last one): the replica must truncate or refetch first."""

    def __init__(self, message: str, first_offset: int, log_end_offset: int) -> None:
        super().__init__(ErrorCode.unknown_server_error, message)
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset


class OffsetOutOfRangeError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FollowerAppendResult:
    """What ``append_as_follower`` appended: offsets of the first and last record (-1 when
    nothing was), the number of batches and bytes, and the log end offset afterwards."""

    first_offset: int
    last_offset: int
    batches: int
    bytes: int
    log_end_offset: int


# A record set shorter than this is copied to be rewritten in place (one small copy costs less
# than a header copy, views and a pwritev per batch); a longer one is written as it came.
COPY_BELOW = 64 * 1024

# Read on every append: a module constant (an enum member looked up on its class goes through
# EnumType's __getattr__ hook, several times the cost of a global).
_MARKER = AppendOrigin.MARKER


class PartitionLog:
    def __init__(self, directory: Path, config: LogConfig, now_ms: int,
                 preallocator: Preallocator | None = None) -> None:
        self.directory = Path(directory)
        self.config = config
        self.preallocator = preallocator
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segments: list[LogSegment] = []
        self.unflushed_messages = 0
        self.recovered_bytes = 0
        self.producer_state = ProducerStateManager()
        self.last_snapshot_ms = now_ms
        self.last_snapshot_offset = -1  # the log end offset of this process's last snapshot
        self._high_watermark_checkpoint_ms = now_ms
        self._recovered_from: int | None = None  # first offset validated after an unclean stop
        self._roll_jitter_ms = 0  # the active segment's share of segment.jitter.ms
        self._flushed_ms = now_ms
        self.generation = 0  # moved by cuts and deletions: no stale cleaning is swapped in
        try:
            load_segments(self, now_ms)
            self._log_start_offset = log_start.load_log_start_offset(self)
            load_producer_state(self)
            self.leader_epoch_cache = load_leader_epoch_cache(self)
            self._high_watermark = read_high_watermark(self)
            self.producer_state.on_high_watermark_updated(self._high_watermark)
            self._persisted_high_watermark: int | None = None  # written at the next flush
        except BaseException:
            self.close_unclean()  # a log that could not open keeps no file open (EMFILE, ENOSPC)
            raise

    # -- checkpoints and replay (opening the log is log/loader.py) ---------------------------

    def _write_high_watermark(self) -> None:
        if self._persisted_high_watermark == self._high_watermark:
            return
        write_offset_file(self.directory / HIGH_WATERMARK_FILE, self._high_watermark)
        self._persisted_high_watermark = self._high_watermark

    def _replay_marker(self, seg: LogSegment, h: BatchHeader, buf, pos: int) -> None:
        """A control batch already in ``seg`` (its bytes at ``pos`` in ``buf``): a COMMIT or
        ABORT marker closes its producer's transaction, an abort goes into the index unless the
        index already has it. Any other control batch ends nothing."""
        try:
            _, records = decode_batch(buf, pos, verify_crc=False)
            ctype, coordinator_epoch = parse_control_record(records[0])
        except (CorruptRecordError, IndexError):
            return  # not a marker we can read: it ends no transaction
        if ctype in (CONTROL_ABORT, CONTROL_COMMIT):
            done = self.producer_state.complete_txn(h, ctype == CONTROL_COMMIT,
                                                    coordinator_epoch)
            # The index is derived: put back an entry a crash kept from the file.
            # Only past the last entry: a lost one is at the tail; a cleaned segment omits some.
            entries = seg.txn_index.entries
            if done.is_aborted and (not entries or done.last_offset > entries[-1].last_offset):
                self._index_aborted(seg, done)

    def iter_headers_from(self, offset: int):
        """(segment, position, header) for every batch whose last offset is >= ``offset``."""
        for seg in self.segments:
            if seg.next_offset <= offset:
                continue
            found = seg.find_batch(offset)
            if found is None:
                continue
            for pos, h in seg.iter_headers(found[0]):
                yield seg, pos, h

    # -- properties ---------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_start_offset(self) -> int:
        """The first offset served (KIP-107: DeleteRecords moves it; log/log_start.py)."""
        return self._log_start_offset

    def increment_log_start_offset(self, offset: int, now_ms: int) -> bool:
        """Move the log start forward (log/log_start.py); False when it is there already."""
        return log_start.increment_log_start_offset(self, offset, now_ms)

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        log_start.truncate_fully_and_start_at(self, offset, now_ms)

    @property
    def log_end_offset(self) -> int:
        return self.active_segment.next_offset

    @property
    def high_watermark(self) -> int:
        """The offset below which the in-sync replicas have everything (what consumers read up
        to); moved by ``update_high_watermark`` only, never by an append."""
        return self._high_watermark

    def update_high_watermark(self, offset: int) -> int:
        """Move the stored high watermark up to ``offset``, clamped to [log start, log end]
        (Kafka's maybeUpdateHighWatermark: it never moves back; only ``truncate_to`` lowers it).
        Persisted on flush, roll, close and ``maintain``. Returns the high watermark."""
        end = self.segments[-1].next_offset  # (every acks=all append comes here: kept lean)
        hw = max(self.log_start_offset, min(end, offset))
        if hw > self._high_watermark:
            self._high_watermark = hw
            if self.producer_state.unreplicated:
                self.producer_state.on_high_watermark_updated(hw)
        return self._high_watermark

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch: the leader-epoch cache's answer with
        this log's end (log/leader_epoch.py, ``end_offset_for``)."""
        return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    @property
    def last_stable_offset(self) -> int:
        """spec 000, "Last Stable Offset Tracking": the first offset of the oldest open
        transaction, or ended one whose marker is not below the high watermark yet (Kafka's
        firstUnstableOffset), or the high watermark when there is none. read_committed
        consumers see only what lies below it. Never below the log start (Kafka's UnifiedLog raises the first
        unstable offset to the log start offset): DeleteRecords or retention past the start
        of an open transaction leaves nothing below the log start to wait for, and an LSO
        there would send read_committed consumers at "latest" out of range and round again."""
        first_unstable = self.producer_state.first_unstable_offset()
        hw = self.high_watermark
        if first_unstable is None:
            return hw
        return min(max(first_unstable, self.log_start_offset), hw)

    def aborted_transactions(self, start_offset: int, upper_bound_offset: int
                             ) -> list[AbortedTxn]:
        """The aborted transactions that intersect [start_offset, upper_bound_offset): what a
        read_committed fetch from ``start_offset`` returns beside its data."""
        out: list[AbortedTxn] = []
        for seg in self.segments:
            if seg.next_offset > start_offset:
                out.extend(seg.txn_index.collect(start_offset, upper_bound_offset))
        return out

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- appending ----------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview,
               batches: list[tuple[int, BatchHeader]],
               now_ms: int, *, origin: AppendOrigin = AppendOrigin.CLIENT,
               verification: VerificationGuard | None = None,
               require_verification: bool = False, new_client: bool = False,
               leader_epoch: int | None = None,
               checked: dict[int, tuple[int, int]] | None = None,
               transaction_version: int = 0) -> AppendResult:
        """The leader's append (Kafka's appendAsLeader) of validated batches (``batches``:
        ``split_batches(data)``, which cover it end to end; ``data`` is the record set: a
        bytearray is rewritten in place, bytes are written as they came with each batch's
        header rewritten in a copy of its own). ``origin`` (log/append_origin.py): CLIENT and
        COORDINATOR records are data batches; a MARKER is one COMMIT/ABORT control batch
        (``transaction_version``: its WriteTxnMarkers v2 field).

        Producer state is checked first: a retried batch that duplicates one of the producer's
        last five is answered with its original offsets and nothing is written.
        ``require_verification`` (KIP-890): a transactional batch that opens the producer's
        transaction here needs ``verification``, the guard of a successful check with the
        coordinator that no marker has dropped since.
        ``leader_epoch`` (a partition leader's append): stamped into every batch's
        partitionLeaderEpoch and recorded in the leader-epoch cache.
        ``checked``: log/validator.py ``check_compressed``'s findings, not read again.
        """
        if origin is _MARKER:
            return self._append_marker(data, batches, now_ms, leader_epoch,
                                       transaction_version)
        if require_verification:
            for _pos, h in batches:
                try:
                    self.producer_state.check_verified(h, verification)
                except ProducerStateError as exc:
                    raise LogAppendError(exc.error_name, str(exc)) from None
        max_bytes = self.config.max_message_bytes
        for _pos, h in batches:
            if h.attributes & ATTR_CONTROL:  # Kafka's LogValidator: only markers are control
                raise LogAppendError(ErrorCode.invalid_record,
                                     f"a {origin.value} append may not write control batches")
            if h.size > max_bytes:
                raise LogAppendError(
                    ErrorCode.message_too_large,
                    f"batch of {h.size} bytes exceeds max.message.bytes "
                    f"{self.config.max_message_bytes}",
                )
        try:
            data, batches = validate_records(self.config, data, batches, now_ms,
                                             self.directory.name, checked)
            converted = convert_compression(self.config, data, batches)
        except RecordsError as exc:
            raise LogAppendError(exc.error_name, str(exc), exc.record_errors) from None
        if converted is not None:  # the topic's compression.type: sizes change, checked again
            data, batches = converted
            for _pos, h in batches:
                if h.size > self.config.max_message_bytes:
                    raise LogAppendError(
                        ErrorCode.message_too_large,
                        f"batch of {h.size} bytes once recompressed ({self.config.compression_type})"
                        f" exceeds max.message.bytes {self.config.max_message_bytes}")
        if len(batches) == 1:
            dup = self._check_producer(batches[0][1], new_client)
            if dup is not None:
                # As Kafka (analyzeAndValidateProducerState): a duplicate is answered with the
                # first one's offsets, and its max timestamp as the log append time.
                return AppendResult(dup.first_offset, dup.last_offset, dup.timestamp,
                                    self.log_start_offset, duplicate=True)
        else:
            for _pos, h in batches:
                if self._check_producer(h) is not None:
                    raise LogAppendError(
                        ErrorCode.duplicate_sequence_number,
                        "a multi-batch record set repeats an earlier batch",
                    )
        assigned, log_append_time = self._write(data, batches, now_ms, leader_epoch)
        return AppendResult(assigned[0][1].base_offset, assigned[-1][1].last_offset,
                            log_append_time, self.log_start_offset)

    def append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                      coordinator_epoch: int, now_ms: int, *, leader_epoch: int | None = None,
                      transaction_version: int = 0) -> AppendResult:
        """Build a COMMIT or ABORT control batch for the producer's transaction and append it
        as a MARKER (``append``)."""
        data = bytearray(build_control_batch(
            CONTROL_COMMIT if commit else CONTROL_ABORT, producer_id=producer_id,
            producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch,
            timestamp=now_ms))
        return self.append(data, split_batches(data), now_ms, origin=AppendOrigin.MARKER,
                           leader_epoch=leader_epoch, transaction_version=transaction_version)

    def _append_marker(self, data: bytes | bytearray | memoryview,
                       batches: list[tuple[int, BatchHeader]], now_ms: int,
                       leader_epoch: int | None, transaction_version: int) -> AppendResult:
        """A COMMIT or ABORT control batch the caller built (the partition leader's half of
        WriteTxnMarkers, spec 000 step 5.2): its producer's transaction closes, the LSO moves
        on, and an abort is added to the aborted-transaction index."""
        if len(batches) != 1 or not batches[0][1].is_control \
                or not batches[0][1].is_transactional:
            raise LogAppendError(ErrorCode.invalid_record,
                                 "a marker is one transactional control batch")
        pos, h = batches[0]
        if type(data) is not bytearray:
            data = bytearray(data)  # (a few bytes) rewritten in place
        try:
            _, records = decode_batch(data, pos, verify_crc=False)
            ctype, coordinator_epoch = parse_control_record(records[0])
        except (CorruptRecordError, IndexError) as exc:
            raise LogAppendError(ErrorCode.corrupt_message, f"a marker that cannot be read: {exc}") \
                from None
        if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
            raise LogAppendError(ErrorCode.invalid_record, f"control type {ctype} is no marker")
        try:
            self.producer_state.check_marker(h.producer_id, h.producer_epoch, coordinator_epoch,
                                             transaction_version)
        except ProducerStateError as exc:
            raise LogAppendError(exc.error_name, str(exc)) from None
        assigned, log_append_time = self._write(data, batches, now_ms, leader_epoch)
        _pos, h = assigned[0]  # (its transaction closed by the writer, as a follower's)
        return AppendResult(h.base_offset, h.last_offset, log_append_time, self.log_start_offset)

    def append_as_follower(self, data: bytes | bytearray | memoryview,
                           now_ms: int | None = None) -> FollowerAppendResult:
        """Append the leader's batches unchanged: ``data`` is the record set of a Fetch
        response, possibly ending in a partial batch (ignored). Kafka's appendAsFollower.

        Every batch's CRC is checked (LogAppendError ``corrupt_message``, nothing written);
        batches wholly below the log end are skipped (a refetch); the rest must continue the
        log at or after its end without an overlap (UnexpectedAppendOffsetError, nothing
        written; a gap is where a compacted leader's cleaner removed batches). Offsets, epochs
        and timestamps are kept; segments roll as for any append.
        Producer state is updated without sequence checks (replication origin): data batches
        as appended, COMMIT/ABORT markers close transactions and fill the aborted-transaction
        index exactly as ``append_marker`` does on the leader. Each batch's partitionLeaderEpoch
        goes into the leader-epoch cache. max.message.bytes is not applied: the leader took the
        batches. Returns what was appended and the new log end.
        """
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        # A memoryview (a fetcher's view of the response it received) is read in place.
        buf = data if isinstance(data, bytes | bytearray) else memoryview(data).cast("B")
        batches: list[tuple[int, BatchHeader]] = []
        expected = self.log_end_offset
        pos, n = 0, len(buf)
        try:
            while n - pos >= LOG_OVERHEAD:
                _base, length = _OFFSET_LENGTH.unpack_from(buf, pos)
                if length < HEADER_SIZE - LOG_OVERHEAD:
                    raise CorruptRecordError(f"batch length {length} below the header size")
                if pos + LOG_OVERHEAD + length > n:
                    break  # a partial batch ends the response: the next fetch gets it whole
                h = validate_batch(buf, pos, cleaned=True)  # the leader's log may be cleaned
                if not batches and h.last_offset < expected:
                    pos += h.size
                    continue  # already here: the fetch started below our end
                # A gap is what a compacted leader's log has where the cleaner removed
                # batches (Kafka's appendAsFollower refuses only an overlap).
                if h.base_offset < expected:
                    raise UnexpectedAppendOffsetError(
                        f"an overlap: replicated batch at offset {h.base_offset} "
                        f"({h.records_count} records) where offset {expected} was expected "
                        f"(log end {self.log_end_offset})", h.base_offset, self.log_end_offset)
                batches.append((pos, h))
                expected = h.next_offset
                pos += h.size
        except CorruptRecordError as exc:
            raise LogAppendError(ErrorCode.corrupt_message,
                                 f"replicated batch at offset {expected}: {exc}") from None
        if not batches:
            return FollowerAppendResult(-1, -1, 0, 0, self.log_end_offset)
        for _pos, h in batches:
            if h.partition_leader_epoch >= 0:
                self.leader_epoch_cache.assign(h.partition_leader_epoch, h.base_offset)
        # Runs of batches that fit in a segment: a fetch response can span a size roll.
        split: list[list[tuple[int, BatchHeader]]] = []
        run: list[tuple[int, BatchHeader]] = []
        size = self.active_segment.size
        run_base = self.active_segment.base_offset
        for pos, h in batches:
            if size and (size + h.size > self.config.segment_bytes
                         or h.last_offset - run_base > INT32_MAX):
                if run:
                    split.append(run)
                    run = []
                size = 0
                run_base = h.base_offset
            run.append((pos, h))
            size += h.size
        split.append(run)
        runs = []
        total = 0
        for run in split:
            start = run[0][0]
            end = run[-1][0] + run[-1][1].size
            runs.append((start, [memoryview(buf)[start:end]], run, end - start,
                         max(h.max_timestamp for _, h in run),
                         sum(h.records_count for _, h in run)))
            total += end - start
        self._write_runs(buf, runs, now_ms)
        return FollowerAppendResult(batches[0][1].base_offset, batches[-1][1].last_offset,
                                    len(batches), total, self.log_end_offset)

    def truncate_to(self, offset: int) -> int:
        """Remove every record at and after ``offset`` (Kafka's truncateTo, a follower cutting
        a tail that diverged from its leader's log). Returns the new log end offset.

        A batch holding ``offset`` goes whole, so the log may end below ``offset``; an
        ``offset`` at or below the log start empties the log, which still starts there. Later
        segments are deleted, the one holding ``offset`` cut (log, offset, time and
        transaction indexes), producer snapshots above the new end deleted and the producer
        state rebuilt from the latest one left (transactions whose marker went are open again,
        producers whose batches went are as before them), leader-epoch entries from the new end
        on dropped, the high watermark and recovery point lowered to it. Nothing else changes
        when ``offset`` is at or past the log end, except that leader-epoch entries starting at
        or after ``offset`` are still dropped (KAFKA-10706).
        """
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        self.generation += 1
        if offset >= self.log_end_offset:
            self.leader_epoch_cache.truncate_from_end(offset)
            return self.log_end_offset
        offset = max(offset, self.segments[0].base_offset)
        # Keep the segments that hold something below ``offset`` (always the first).
        keep = 1
        while keep < len(self.segments) and self.segments[keep].base_offset < offset:
            keep += 1
        for seg in self.segments[keep:]:
            seg.delete()
        del self.segments[keep:]
        self.active_segment.truncate_to(offset)
        end = self.log_end_offset
        log_start.after_truncation(self)
        load_producer_state(self)  # deletes the snapshots above ``end``
        self.leader_epoch_cache.truncate_from_end(end)
        if self._high_watermark > end:
            self._high_watermark = end
            self._write_high_watermark()
        self.producer_state.on_high_watermark_updated(self._high_watermark)
        if (read_offset_file(self.directory / RECOVERY_POINT_FILE) or 0) > end:
            write_offset_file(self.directory / RECOVERY_POINT_FILE, end)
        self.unflushed_messages = 0
        return end

    def _index_aborted(self, seg: LogSegment, done: CompletedTxn) -> None:
        # The LSO once this transaction is closed: the oldest transaction still open, or
        # everything up to the marker (Kafka's lastStableOffset(completedTxn)).
        first_unstable = self.producer_state.first_undecided_offset()
        lso = done.last_offset + 1 if first_unstable is None \
            else max(first_unstable, self.log_start_offset)
        seg.txn_index.append(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                        lso))

    def _write(self, data: bytes | bytearray, batches: list[tuple[int, BatchHeader]], now_ms: int,
               leader_epoch: int | None = None) -> tuple[list[tuple[int, BatchHeader]], int]:
        """Assign offsets (and LogAppendTime, and the leader epoch) in ``data``, roll if due,
        write it to the active segment; returns the batches' headers as written and the append
        time (-1 if none)."""
        if leader_epoch is not None and leader_epoch < 0:
            raise ValueError(f"invalid leader epoch {leader_epoch}")
        log_append_time = -1
        if self.config.message_timestamp_type == "LogAppendTime":
            log_append_time = now_ms
        offset = self.log_end_offset
        assigned: list[tuple[int, BatchHeader]] = []
        max_timestamp = -1
        records = 0
        if type(data) is not bytearray and (log_append_time >= 0 or len(data) < COPY_BELOW):
            data = bytearray(data)  # rewritten past the header, or small: copied (COPY_BELOW)
        # The request's bytes (immutable) are written as they came, each batch's header
        # rewritten in a 61-byte copy of its own: a record set is not copied to be appended.
        pieces: list = [] if type(data) is not bytearray else [data]
        view = memoryview(data) if not pieces else None
        for pos, h in batches:
            if view is not None:
                head = bytearray(view[pos:pos + HEADER_SIZE])
                pieces.append(head)
                pieces.append(view[pos + HEADER_SIZE:pos + h.size])
                buf, at = head, 0
            else:
                buf, at = data, pos  # type: ignore[assignment]  # a bytearray here
            set_base_offset(buf, at, offset)
            if log_append_time >= 0:
                set_log_append_time(buf, at, h.size, log_append_time)
                h = h._replace(attributes=h.attributes | 0x08, max_timestamp=log_append_time)
            if leader_epoch is not None:
                set_partition_leader_epoch(buf, at, leader_epoch)
                h = h._replace(base_offset=offset, partition_leader_epoch=leader_epoch)
            else:
                h = h._replace(base_offset=offset)
            assigned.append((pos, h))
            offset = h.next_offset
            records += h.records_count
            max_timestamp = max(max_timestamp, h.max_timestamp)
        if leader_epoch is not None:
            # Before the data, as Kafka: a crash in between leaves an entry past the log end,
            # which opening the log drops, never data whose epoch the cache misses.
            self.leader_epoch_cache.assign(leader_epoch, assigned[0][1].base_offset)
        self._write_runs(data, [(0, pieces, assigned, len(data), max_timestamp, records)],
                         now_ms)
        return assigned, log_append_time

    def _write_runs(self, buf, runs: list[tuple[int, list, list[tuple[int, BatchHeader]], int,
                                               int, int]], now_ms: int) -> None:
        """The one writer behind every append (a leader's records and markers, a follower's
        copy of the leader's batches): each run of offset-assigned batches -- (its start in
        ``buf``, the pieces to write, (position in ``buf``, header) of each batch, bytes, max
        timestamp, records) -- into the active segment, the first after a roll if due, the
        others each in a new segment; then the producer state from each batch (a COMMIT or
        ABORT marker closes its transaction, an abort goes into the index); a flush when
        flush.messages are unflushed."""
        first = True
        for start, pieces, headers, size, max_timestamp, records in runs:
            if first:
                self._maybe_roll(size, max_timestamp, now_ms, headers[-1][1].last_offset)
                first = False
            else:
                self.roll(now_ms)
            seg = self.active_segment
            seg.append(pieces, headers if start == 0
                       else [(pos - start, h) for pos, h in headers])
            self._maybe_preallocate(seg, size)
            for pos, h in headers:
                if h.attributes & ATTR_CONTROL:
                    self._replay_marker(seg, h, buf, pos)
                else:
                    self.producer_state.update(h)
            self.unflushed_messages += records
        if self.unflushed_messages >= self.config.flush_messages:
            self.flush()

    def _maybe_preallocate(self, seg: LogSegment, append_size: int) -> None:
        ahead = min(self.config.preallocate_ahead_bytes, 16 * append_size)
        if self.preallocator is None or ahead < (1 << 20):
            return
        if seg.allocated - seg.size < ahead // 2:
            target = min(seg.size + ahead, self.config.segment_bytes)
            if target > seg.allocated:
                self.preallocator.request(seg, target)

    def _check_producer(self, h: BatchHeader, new_client: bool = False) -> BatchMetadata | None:
        try:
            return self.producer_state.check_batch(h, new_client)
        except ProducerStateError as exc:
            raise LogAppendError(exc.error_name, str(exc)) from None

    def _maybe_roll(self, incoming: int, incoming_max_timestamp: int, now_ms: int,
                    incoming_last_offset: int = -1) -> None:
        seg = self.active_segment
        if seg.size == 0:
            return
        too_big = seg.size + incoming > self.config.segment_bytes
        # Kafka's LogSegment.canConvertToRelativeOffset: the indexes store offsets relative to
        # the segment's base in 32 bits; roll before the incoming last offset would not fit.
        too_big = too_big or incoming_last_offset - seg.base_offset > INT32_MAX
        # Kafka's segment.ms (LogSegment.timeWaitedForRoll): the incoming batches' timestamp
        # minus the first batch's, so that records carrying old timestamps do not roll a segment
        # per append; wall-clock age only when the segment has no timestamped batch.
        first_ts = seg.first_batch_timestamp
        if first_ts is not None and first_ts >= 0:
            waited = incoming_max_timestamp - first_ts
        else:
            waited = now_ms - seg.created_ms
        too_old = waited >= self.config.segment_ms - self._roll_jitter_ms
        if too_big or too_old:
            self.roll(now_ms)

    def roll(self, now_ms: int) -> None:
        """Start a new segment at the log end; the old one is flushed and becomes immutable.

        All or nothing: when a file cannot be opened or written (no descriptor left, EMFILE;
        a full disk) the new segment's files are removed, the old segment stays the active
        one and LogWriteError is raised, which Produce answers with the retriable
        KAFKA_STORAGE_ERROR for the partition; a retry rolls once the cause is gone."""
        old = self.active_segment
        new_base = old.next_offset
        seg = None
        try:
            old.trim()
            old.flush()
            seg = LogSegment(self.directory, new_base, self.config.index_interval_bytes, now_ms)
            seg.load(recover=True)
            # The checkpoints of the roll, before the segment joins the log: the recovery
            # point and producer snapshot at its base hold whether or not it does.
            write_offset_file(self.directory / RECOVERY_POINT_FILE, new_base)
            self._write_high_watermark()
            self.take_snapshot(now_ms)
        except OSError as exc:
            if seg is not None:
                seg.delete()
            else:  # the log file may exist when one of the index files could not be opened
                for suffix in (".log", ".index", ".timeindex"):
                    (self.directory / segment_name(new_base, suffix)).unlink(missing_ok=True)
            raise LogWriteError(exc.errno or 0, f"cannot roll {self.directory.name} at offset "
                                f"{new_base}: {os_error_name(exc)}") from exc
        self.unflushed_messages = 0
        jitter = min(self.config.segment_jitter_ms, self.config.segment_ms)
        self._roll_jitter_ms = random.randrange(jitter) if jitter > 0 else 0
        self.segments.append(seg)

    def flush(self) -> None:
        self._flushed_ms = int(time.time() * 1000)
        self.active_segment.flush()
        self.unflushed_messages = 0
        try:
            write_offset_file(self.directory / RECOVERY_POINT_FILE, self.log_end_offset)
            self._write_high_watermark()
        except OSError as exc:
            # Checkpoints: one not written costs a longer recovery at the next start, never
            # data; an append that is in the log must not be answered as failed for it.
            log.warning("%s: checkpoints not written after a flush: %s", self.directory.name,
                        os_error_name(exc))

    # -- producer snapshots -------------------------------------------------------------------

    def take_snapshot(self, now_ms: int) -> Path:
        offset = self.log_end_offset
        path = self.directory / segment_name(offset, ".snapshot")
        tmp = path.with_suffix(".snapshot.tmp")
        with open(tmp, "wb") as f:
            f.write(self.producer_state.snapshot_bytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self.last_snapshot_ms = now_ms
        self.last_snapshot_offset = offset
        snaps = snapshot_files(self.directory)
        for _off, p in snaps[:-SNAPSHOTS_TO_KEEP]:
            p.unlink(missing_ok=True)
        return path

    # -- periodic maintenance -----------------------------------------------------------------

    def maintain(self, now_ms: int) -> None:
        """Producer-id expiration, age-based roll and periodic snapshots. (Retention runs on
        its own interval, ``log.retention.check.interval.ms``: ``apply_retention``.)"""
        self.producer_state.expire(now_ms, self.config.producer_id_expiration_ms)
        seg = self.active_segment
        if seg.size and now_ms - (seg.first_batch_timestamp or now_ms) >= \
                self.config.segment_ms - self._roll_jitter_ms:
            self.roll(now_ms)
        if self.unflushed_messages and now_ms - self._flushed_ms >= self.config.flush_ms:
            self.flush()  # Kafka's flush.ms
        if now_ms - self.last_snapshot_ms >= self.config.producer_snapshot_interval_ms:
            if self.log_end_offset != self.last_snapshot_offset:
                self.take_snapshot(now_ms)  # an fsync each: not for a partition with no news
            else:
                self.last_snapshot_ms = now_ms
        if now_ms - self._high_watermark_checkpoint_ms >= HIGH_WATERMARK_CHECKPOINT_INTERVAL_MS:
            self._high_watermark_checkpoint_ms = now_ms
            self._write_high_watermark()

    def apply_retention(self, now_ms: int) -> list[int]:
        """Delete whole segments below the log start, past retention.ms or beyond
        retention.bytes; never the active segment, and by time or size only with "delete" in
        cleanup.policy. Returns the base offsets deleted."""
        deleted: list[int] = []
        if "delete" not in self.config.cleanup_policy:
            return deleted
        total = self.size_bytes
        below_start = log_start.breached_segments(self)
        while len(self.segments) > 1:
            seg = self.segments[0]
            by_time = self.config.retention_ms >= 0 and seg.max_timestamp >= 0 and (
                now_ms - seg.max_timestamp > self.config.retention_ms
            )
            by_size = self.config.retention_bytes >= 0 and (
                total - seg.size >= self.config.retention_bytes
            )
            if not (by_time or by_size or len(deleted) < below_start):
                break
            total -= seg.size
            deleted.append(seg.base_offset)
            seg.delete()
            del self.segments[0]
        if deleted:
            log_start.after_segments_deleted(self)
            self.leader_epoch_cache.truncate_from_start(self.log_start_offset)
            self._high_watermark = max(self._high_watermark, self.log_start_offset)
            self.producer_state.on_high_watermark_updated(self._high_watermark)
        return deleted

    # -- reading ------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one: bool = True) -> bytes:
        """Batches from the one containing ``offset``, up to ``max_bytes`` (but at least one
        whole batch when ``min_one``: Kafka's minOneMessage, for the first partition of a fetch
        response that has data), none at or beyond ``max_offset`` (default: the high
        watermark)."""
        found = self._locate(offset, max_offset)
        if found is None:
            return b""
        seg, pos, max_pos = found
        return seg.read(pos, max_bytes, max_pos, min_one)

    def read_region(self, offset: int, max_bytes: int, max_offset: int | None = None,
                    min_one: bool = True) -> FileRegion | bytes:
        """What ``read`` returns, left in the segment file: a FileRegion for the network to
        send in chunks (a Fetch response), b"" when there is nothing."""
        found = self._locate(offset, max_offset)
        if found is None:
            return b""
        seg, pos, max_pos = found
        return seg.read_region(pos, max_bytes, max_pos, min_one)

    def _locate(self, offset: int, max_offset: int | None
                ) -> tuple[LogSegment, int, int | None] | None:
        """(segment, position of the batch holding ``offset``, position not to read past)."""
        if max_offset is None:
            max_offset = self.high_watermark
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} outside [{self.log_start_offset}, {self.log_end_offset}]"
            )
        if offset >= max_offset:
            return None
        for seg in self.segments:
            if seg.next_offset <= offset:
                continue
            found = seg.find_batch(offset)
            if found is None:
                continue
            pos, _h = found
            max_pos = None
            if max_offset < seg.next_offset:
                end = seg.find_batch(max_offset)
                max_pos = end[0] if end is not None else None
            return seg, pos, max_pos
        return None

    def iter_records(self, chunk_bytes: int = 1 << 20):
        """(header, records) of every batch from the log start to its end, control batches
        included: how a coordinator replays its internal topic at startup (to the log end, past
        the high watermark, as Kafka's coordinators load)."""
        offset = self.log_start_offset
        while offset < self.log_end_offset:
            data = self.read(offset, chunk_bytes, self.log_end_offset)
            if not data:
                return
            for pos, h in iter_batches(data):
                offset = h.next_offset
                _, records = decode_batch(data, pos, verify_crc=False)
                yield h, records

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        for seg in self.segments:
            found = seg.offset_for_timestamp(timestamp)
            if found is not None:
                return found
        return None

    def max_timestamp(self) -> tuple[int, int]:
        """(timestamp, offset) of the record with the largest timestamp, or (-1, -1): the first
        such record of the first batch that has it (Kafka 3.8+, KAFKA-16310; before, the batch's
        last offset). The segments keep the batch; its records are read here, on request."""
        best, where = (-1, -1), None
        for seg in self.segments:
            if seg.max_timestamp > best[0]:
                best, where = (seg.max_timestamp, seg.offset_of_max_timestamp), seg
        if where is None:
            return best
        # No record of the segment is later: its first record at or after the maximum is it.
        try:
            record = where.offset_for_timestamp(best[0])
        except CorruptRecordError:
            return best
        return best if record is None else (record[1], record[0])

    # -- shutdown -----------------------------------------------------------------------------

    def close(self, now_ms: int) -> None:
        """Clean shutdown: flush, snapshot the producer state at the log end, mark clean."""
        self.flush()
        self.take_snapshot(now_ms)
        for seg in self.segments:
            seg.close()
        (self.directory / CLEAN_SHUTDOWN_FILE).touch()

    def close_unclean(self) -> None:
        """Drop the files as a crash would: no flush, no snapshot, no trim, no clean marker."""
        for seg in self.segments:
            seg.close(trim=False)

    def delete(self) -> None:
        for seg in self.segments:
            seg.close()
        shutil.rmtree(self.directory, ignore_errors=True)


"""One log segment: a ``.log`` file of v2 batches, its sparse ``.index`` and ``.timeindex``, and
its aborted-transaction index ``.txnindex`` (log/txn_index.py).

Files are named by the segment's 20-digit base offset, as Kafka names them. The offset index
holds (relative offset int32, position int32) entries, the offset being the last offset of the
batch at the position (as Kafka's LogSegment writes them), the time index (timestamp int64,
relative offset int32), one entry per ``index.interval.bytes`` of log, both append-only. The indexes are
derived data: when one is missing or damaged it is rebuilt from the log.
"""

from __future__ import annotations

import bisect
import errno
import logging
import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

from ..records.batch import (
    HEADER_SIZE,
    INT32_MAX,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    CorruptRecordError,
    find_timestamp,
    parse_header,
    validate_batch,
)
from ..records.region import FileRegion
from .txn_index import TransactionIndex

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_OFFSET_LENGTH = struct.Struct(">qi")
# A batch header's base offset, length, lastOffsetDelta and maxTimestamp (records/batch.py)
_INDEX_CHECK = struct.Struct(">qi11xi8xq")
_ZEROS = bytes(1 << 20)

log = logging.getLogger("oncelog.log")


def os_error_name(exc: OSError) -> str:
    """"ENOSPC (No space left on device)": the errno's name first, so that a full disk or a
    process out of descriptors (EMFILE) reads as such in logs and error messages."""
    name = errno.errorcode.get(exc.errno or 0)
    text = exc.strerror or str(exc)
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{name} ({text}){where}" if name else f"{text}{where}"


class LogWriteError(OSError):
    """Writing to the log failed (disk full, IO error); the segment was left unchanged."""


def _all_zeros(fd: int, start: int, end: int) -> bool:
    pos = start
    while pos < end:
        chunk = os.pread(fd, min(len(_ZEROS), end - pos), pos)
        if not chunk or chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def _torn_batch_start(head: bytes, next_offset: int) -> int | None:
    """The base offset of a batch whose write stopped inside its header, when its first 12
    bytes (base offset, length) are there and plausible."""
    if len(head) < LOG_OVERHEAD:
        return None
    base, length = _OFFSET_LENGTH.unpack(head)
    if base < next_offset or base > next_offset + (1 << 31) or length < HEADER_SIZE - LOG_OVERHEAD:
        return None
    return base


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int,
                 created_ms: int, suffix: str = "") -> None:
        """``suffix``: the log cleaner's segments under construction (``.cleaned``) and
        being swapped in (``.swap``) carry it after each file's name, as in Kafka."""
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.suffix = suffix
        self.log_path = directory / segment_name(base_offset, ".log" + suffix)
        self.index_path = directory / segment_name(base_offset, ".index" + suffix)
        self.timeindex_path = directory / segment_name(base_offset, ".timeindex" + suffix)
        self.txn_index = TransactionIndex(
            directory / segment_name(base_offset, ".txnindex" + suffix))
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        # in-memory copies of the sparse indexes
        self.index_offsets: list[int] = []  # absolute offsets
        self.index_positions: list[int] = []
        self.time_timestamps: list[int] = []
        self.time_offsets: list[int] = []
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.created_ms = created_ms
        self.first_batch_timestamp: int | None = None
        self._bytes_since_index = 0
        self._index_fd = -1
        self._timeindex_fd = -1
        # Page-cache preallocation (see log/preallocator.py): the file may extend past
        # ``size`` with zeros; ``lock`` keeps the zero-filling thread and appends apart.
        self.lock = threading.Lock()
        self.allocated = self.size
        self.prealloc_pending = False

    # -- opening ------------------------------------------------------------------------------

    def load(self, recover: bool) -> int:
        """Read the segment's state from disk.

        With ``recover`` every batch is validated (CRC, framing) and the file is truncated at
        the first bad one; the indexes are rebuilt. Returns the number of bytes truncated.
        Without, the indexes are loaded if sane; an index that is not is rebuilt with a full
        recovery of the segment (Kafka's LogLoader on a failed index sanity check), with a
        warning. A truncation is always logged with its figures.
        """
        truncated = 0
        problem = None
        if not recover:
            problem = self._load_indexes() or self._scan_tail_from_last_index_entry()
            if problem is not None:
                log.warning("%s: %s; rebuilding the indexes and validating the segment",
                            self.log_path, problem)
        if recover or problem is not None:
            truncated = self._rebuild()
        self._open_index_files()
        self.txn_index.load()
        self.txn_index.truncate_to(self.next_offset)
        return truncated

    def _load_indexes(self) -> str | None:
        """Load the offset and time indexes if they are sane; otherwise say what is wrong.

        Kafka's sanity check looks at the file sizes and the last entry; this goes further, as
        a wrong entry sends a fetch or a timestamp lookup to the wrong place: every offset-index
        entry must name the last offset of the batch that starts at its position, as Kafka's
        do (one header read each; in memory we keep that batch's base offset), and every time-index entry the last offset and max timestamp of a batch
        (usually one of those just read; else a few header reads from the offset-index entry
        before it). About 1 µs an entry, an entry per ``index.interval.bytes`` of log.
        """
        try:
            raw = self.index_path.read_bytes()
            traw = self.timeindex_path.read_bytes()
        except FileNotFoundError as exc:
            return f"{Path(str(exc.filename)).name} is missing"
        for path, data, entry in ((self.index_path, raw, _OFFSET_ENTRY),
                                  (self.timeindex_path, traw, _TIME_ENTRY)):
            if len(data) % entry.size:
                return f"{path.name} is {len(data)} bytes, not whole {entry.size}-byte entries"
        offsets: list[int] = []
        positions: list[int] = []
        # last offset -> max timestamp of the indexed batches: most time-index entries name
        # one of them, and are then checked without another read.
        indexed: dict[int, int] = {}
        for i, (rel, pos) in enumerate(_OFFSET_ENTRY.iter_unpack(raw)):
            offset = self.base_offset + rel
            head = os.pread(self.fd, HEADER_SIZE, pos) if pos >= 0 and rel >= 0 else b""
            if len(head) < HEADER_SIZE:
                return (f"{self.index_path.name} entry {i} ({offset} at byte {pos}) is past "
                        f"the last batch of the segment ({self.size} bytes)")
            base, length, last_delta, max_timestamp = _INDEX_CHECK.unpack_from(head)
            # Kafka's entry names the batch's last offset; older oncelog's named its base
            if offset not in (base + last_delta, base) or length < HEADER_SIZE - LOG_OVERHEAD \
                    or pos + LOG_OVERHEAD + length > self.size:
                return (f"{self.index_path.name} entry {i} ({offset} at byte {pos}) does not "
                        f"point at the batch that ends at offset {offset}")
            if positions and (pos <= positions[-1] or base <= offsets[-1]):
                return f"{self.index_path.name} entry {i} ({offset} at byte {pos}) is out of order"
            indexed[base + last_delta] = max_timestamp
            offsets.append(base)
            positions.append(pos)
        self.index_offsets, self.index_positions = offsets, positions
        tts: list[int] = []
        toffs: list[int] = []
        for i, (ts, rel) in enumerate(_TIME_ENTRY.iter_unpack(traw)):
            offset = self.base_offset + rel
            if tts and (ts <= tts[-1] or offset <= toffs[-1]) or rel < 0:
                return f"{self.timeindex_path.name} entry {i} ({ts}, {offset}) is out of order"
            if indexed.get(offset) != ts:
                found = self.find_batch(offset)
                if found is None or found[1].last_offset != offset \
                        or found[1].max_timestamp != ts:
                    return (f"{self.timeindex_path.name} entry {i} ({ts}, {offset}) is not "
                            f"the max timestamp and last offset of a batch")
            tts.append(ts)
            toffs.append(offset)
        self.time_timestamps, self.time_offsets = tts, toffs
        return None

    def _scan_tail_from_last_index_entry(self) -> str | None:
        """Recompute next offset and max timestamp, scanning only from the last index entry;
        say what is wrong when the batches there do not end where the file ends."""
        start = self.index_positions[-1] if self.index_positions else 0
        # max timestamp: the time index keeps the running maximum at each entry
        if self.time_timestamps:
            self.max_timestamp = self.time_timestamps[-1]
            self.offset_of_max_timestamp = self.time_offsets[-1]
        first = True
        end = start
        for pos, h in self.iter_headers(start):
            if first and pos == 0:
                self.first_batch_timestamp = h.max_timestamp
            first = False
            self._track(h)
            end = pos + h.size
        if end != self.size:
            # A sealed or cleanly closed segment ends with its last batch (rolls and clean
            # shutdowns cut preallocated space): anything else is damage.
            return f"the batches end at byte {end} of {self.size}"
        if self.first_batch_timestamp is None and self.size:
            h = self.read_header(0)
            self.first_batch_timestamp = h.max_timestamp
        self._bytes_since_index = self.size - start
        return None

    def _rebuild(self) -> int:
        """Validate every batch (framing, magic, CRC, offsets in order), rebuild the indexes
        from them, and cut the file at the first bad one, with a warning that gives the
        figures (Kafka's LogSegment.recover). Returns the number of bytes cut."""
        self.index_offsets, self.index_positions = [], []
        self.time_timestamps, self.time_offsets = [], []
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.first_batch_timestamp = None
        self._bytes_since_index = 0
        pos = 0
        problem = ""
        while pos < self.size:
            head = os.pread(self.fd, LOG_OVERHEAD, pos)
            if len(head) < LOG_OVERHEAD:
                problem = f"{self.size - pos} bytes, too few for a batch"
                break
            _, length = _OFFSET_LENGTH.unpack(head)
            if length < HEADER_SIZE - LOG_OVERHEAD:
                problem = f"batch length {length} is below the header's"
                break
            if pos + LOG_OVERHEAD + length > self.size:
                problem = (f"a batch of {LOG_OVERHEAD + length} bytes with only "
                           f"{self.size - pos} in the file")
                break
            try:
                h = validate_batch(os.pread(self.fd, LOG_OVERHEAD + length, pos), 0,
                                   cleaned=True)
            except CorruptRecordError as exc:
                problem = str(exc)
                break
            if h.base_offset < self.next_offset and self.next_offset != self.base_offset:
                problem = f"batch offset {h.base_offset} is below {self.next_offset}"
                break  # offsets must increase; anything else is garbage
            self._after_append(pos, h)
            pos += h.size
        truncated = self.size - pos
        if truncated:
            self._warn_truncation(pos, problem)
            os.ftruncate(self.fd, pos)
            self.size = pos
        self.allocated = self.size
        for path in (self.index_path, self.timeindex_path):
            path.unlink(missing_ok=True)
        self._write_index_files()
        return truncated

    def _warn_truncation(self, cut: int, problem: str) -> None:
        """Say what recovery is about to cut at byte ``cut``: the last good offset and what the
        dropped bytes held, as far as their batch headers can still be read."""
        records = 0
        offsets: list[int] = []
        pos = cut
        while pos + HEADER_SIZE <= self.size:
            h = self.read_header(pos)
            if h.magic != MAGIC or h.size < HEADER_SIZE or h.records_count <= 0 \
                    or h.records_count != h.last_offset_delta + 1 \
                    or h.base_offset < self.next_offset:
                break
            records += h.records_count
            offsets += [h.base_offset, h.last_offset]
            pos += h.size
        dropped = self.size - cut
        if records:
            held = (f"{records} record{'s' if records > 1 else ''} in batch headers still "
                    f"readable (offsets {offsets[0]}..{offsets[-1]})")
        elif (part := _torn_batch_start(os.pread(self.fd, LOG_OVERHEAD, cut),
                                        self.next_offset)) is not None:
            held = f"part of a batch at offset {part}"
        elif _all_zeros(self.fd, cut, self.size):
            held = "only zeros (preallocated or never written)"
        else:
            held = "no readable batch"
        last_good = self.next_offset - 1 if self.next_offset > self.base_offset else None
        log.warning("Recovery truncated %s at byte %d (file %d bytes): %s. Last good offset "
                    "%s; dropped %d bytes holding %s", self.log_path, cut, self.size, problem,
                    last_good if last_good is not None else
                    f"none (the segment starting at {self.base_offset} is now empty)",
                    dropped, held)

    def _write_index_files(self) -> None:
        with open(self.index_path, "wb") as f:
            # Kafka's entry: the last offset of the batch at the position
            f.writelines(_OFFSET_ENTRY.pack(self.read_header(pos).last_offset - self.base_offset,
                                            pos) for pos in self.index_positions)
        with open(self.timeindex_path, "wb") as f:
            f.writelines(_TIME_ENTRY.pack(ts, off - self.base_offset) for ts, off in zip(self.time_timestamps, self.time_offsets))

    def _open_index_files(self) -> None:
        self._index_fd = os.open(self.index_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._timeindex_fd = os.open(self.timeindex_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                     0o644)

    # -- appending ----------------------------------------------------------------------------

    def _track(self, h: BatchHeader) -> None:
        self.next_offset = h.next_offset
        if h.max_timestamp > self.max_timestamp:
            self.max_timestamp = h.max_timestamp
            self.offset_of_max_timestamp = h.last_offset

    def _after_append(self, pos: int, h: BatchHeader) -> tuple[bytes, bytes]:
        """Update in-memory state for a batch at ``pos``; return index bytes to persist."""
        if self.first_batch_timestamp is None:
            self.first_batch_timestamp = h.max_timestamp
        self._track(h)
        idx = tidx = b""
        # Index the first batch and then one batch per index.interval.bytes (sparse).
        if not self.index_positions or self._bytes_since_index >= self.index_interval_bytes:
            self.index_offsets.append(h.base_offset)
            self.index_positions.append(pos)
            # on disk, as Kafka's LogSegment writes it: the batch's last offset
            idx = _OFFSET_ENTRY.pack(h.last_offset - self.base_offset, pos)
            if not self.time_timestamps or self.max_timestamp > self.time_timestamps[-1]:
                self.time_timestamps.append(self.max_timestamp)
                self.time_offsets.append(self.offset_of_max_timestamp)
                tidx = _TIME_ENTRY.pack(self.max_timestamp,
                                        self.offset_of_max_timestamp - self.base_offset)
            self._bytes_since_index = 0
        self._bytes_since_index += h.size
        return idx, tidx

    def append(self, pieces: list, headers: list[tuple[int, BatchHeader]]) -> None:
        """Append already-offset-assigned batches, whose bytes are ``pieces`` in order (one
        writev); ``headers`` gives each batch's position in them. On an IO error the file is
        cut back and LogWriteError raised. Offsets that the 32-bit relative index entries
        cannot hold are refused before anything is written (the log rolls first: Kafka's
        canConvertToRelativeOffset)."""
        if headers and headers[-1][1].last_offset - self.base_offset > INT32_MAX:
            raise ValueError(f"offset {headers[-1][1].last_offset} does not fit segment "
                             f"{self.base_offset}'s index: the log must roll first")
        start = self.size
        total = sum(len(p) for p in pieces)
        with self.lock:
            try:
                written = os.pwritev(self.fd, pieces, start) if pieces else 0
                if written < total:  # a short write: the rest one piece of bytes at a time
                    rest = b"".join(pieces)
                    while written < total:  # the next write says why
                        n = os.pwrite(self.fd, memoryview(rest)[written:], start + written)
                        if n == 0:
                            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                        written += n
            except OSError as exc:
                try:
                    os.ftruncate(self.fd, start)
                    self.allocated = start
                except OSError:
                    pass
                raise LogWriteError(exc.errno or 0, f"cannot append to {self.log_path}: "
                                    f"{os_error_name(exc)}") from exc
            self.size = start + total
            self.allocated = max(self.allocated, self.size)
        idx_parts, tidx_parts = [], []
        for pos, h in headers:
            idx, tidx = self._after_append(start + pos, h)
            if idx:
                idx_parts.append(idx)
            if tidx:
                tidx_parts.append(tidx)
        try:
            if idx_parts:
                os.write(self._index_fd, b"".join(idx_parts))
            if tidx_parts:
                os.write(self._timeindex_fd, b"".join(tidx_parts))
        except OSError:
            pass  # indexes are derived; a damaged one is rebuilt at the next start

    def preallocate_to(self, target: int) -> None:
        """Write zeros past the end, up to ``target``, so that appends land in page-cache pages
        that already exist. Runs on the preallocator thread, 1 MiB per lock hold."""
        try:
            while True:
                with self.lock:
                    if self.fd < 0:
                        return
                    start = max(self.allocated, self.size)
                    if start >= target:
                        return
                    n = min(len(_ZEROS), target - start)
                    try:
                        os.pwrite(self.fd, memoryview(_ZEROS)[:n], start)
                    except OSError:
                        os.ftruncate(self.fd, max(self.size, self.allocated))
                        return  # e.g. a full disk: appends will report it
                    self.allocated = start + n
        finally:
            self.prealloc_pending = False

    def trim(self) -> None:
        """Cut the preallocated zeros: the file ends where the log ends."""
        with self.lock:
            if self.fd >= 0 and self.allocated > self.size:
                os.ftruncate(self.fd, self.size)
            self.allocated = self.size

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset`` (a batch holding ``offset`` goes
        whole: a log ends at a batch boundary) from the log file and its three indexes, and
        fsync the file. Returns the segment's new next offset; nothing changes when no batch
        reaches ``offset``."""
        found = self.find_batch(offset)
        if found is None:
            return self.next_offset
        cut = found[0]
        with self.lock:
            os.ftruncate(self.fd, cut)
            self.size = cut
            self.allocated = cut
        keep = bisect.bisect_left(self.index_positions, cut)
        del self.index_offsets[keep:]
        del self.index_positions[keep:]
        # Next offset, max timestamp and the index cadence from the last index entry on, as when
        # the segment is loaded.
        start = self.index_positions[-1] if self.index_positions else 0
        tail = [h for _pos, h in self.iter_headers(start)]
        self.next_offset = tail[-1].next_offset if tail else self.base_offset
        tkeep = bisect.bisect_left(self.time_offsets, self.next_offset)
        del self.time_timestamps[tkeep:]
        del self.time_offsets[tkeep:]
        self.max_timestamp = self.time_timestamps[-1] if self.time_timestamps else -1
        self.offset_of_max_timestamp = self.time_offsets[-1] if self.time_offsets else -1
        for h in tail:
            self._track(h)
        if cut == 0:
            self.first_batch_timestamp = None
        self._bytes_since_index = self.size - start
        self._write_index_files()  # in place: the append descriptors stay valid
        self.txn_index.truncate_to(self.next_offset)
        os.fsync(self.fd)
        return self.next_offset

    def flush(self) -> None:
        os.fsync(self.fd)
        os.fsync(self._index_fd)
        os.fsync(self._timeindex_fd)
        self.txn_index.flush()

    # -- reading ------------------------------------------------------------------------------

    def read_header(self, pos: int) -> BatchHeader:
        return parse_header(os.pread(self.fd, HEADER_SIZE, pos), 0)

    def iter_headers(self, start_pos: int = 0, end_pos: int | None = None
                     ) -> Iterator[tuple[int, BatchHeader]]:
        end = self.size if end_pos is None else end_pos
        pos = start_pos
        while pos + HEADER_SIZE <= end:
            h = self.read_header(pos)
            if h.size < HEADER_SIZE or pos + h.size > end:
                return
            yield pos, h
            pos += h.size

    def lookup_position(self, offset: int) -> int:
        """Position of the last indexed batch whose base offset is <= ``offset``."""
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[i] if i >= 0 else 0

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset``, or None."""
        for pos, h in self.iter_headers(self.lookup_position(offset)):
            if h.last_offset >= offset:
                return pos, h
        return None

    def read(self, start_pos: int, max_bytes: int, max_pos: int | None = None,
             min_one: bool = True) -> bytes:
        """Whole batches from ``start_pos``, at most ``max_bytes`` unless ``min_one`` and the
        first batch alone is larger (it is returned whole so that a consumer can always make
        progress, as KIP-74 specifies), and never beyond ``max_pos``."""
        length = self._extent(start_pos, max_bytes, max_pos, min_one)
        return os.pread(self.fd, length, start_pos) if length else b""

    def read_region(self, start_pos: int, max_bytes: int, max_pos: int | None = None,
                    min_one: bool = True) -> FileRegion | bytes:
        """What ``read`` returns, as a FileRegion of the segment file (empty: b"")."""
        length = self._extent(start_pos, max_bytes, max_pos, min_one)
        return FileRegion(self.fd, start_pos, length) if length else b""

    def _extent(self, start_pos: int, max_bytes: int, max_pos: int | None,
                min_one: bool) -> int:
        end = self.size if max_pos is None else min(max_pos, self.size)
        stop = start_pos
        for bpos, h in self.iter_headers(start_pos, end):
            if bpos + h.size - start_pos > max_bytes and (bpos > start_pos or not min_one):
                break
            stop = bpos + h.size
            if stop - start_pos >= max_bytes:
                break
        return max(0, stop - start_pos)

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp``."""
        if self.max_timestamp < timestamp:
            return None
        i = bisect.bisect_left(self.time_timestamps, timestamp) - 1
        start_offset = self.time_offsets[i] if i >= 0 else self.base_offset
        for pos, h in self.iter_headers(self.lookup_position(start_offset)):
            if h.max_timestamp >= timestamp:
                found = find_timestamp(os.pread(self.fd, h.size, pos), 0, h, timestamp)
                if found is not None:
                    return found
        return None

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self, trim: bool = True) -> None:
        with self.lock:
            if trim and self.fd >= 0 and self.allocated > self.size:
                try:
                    os.ftruncate(self.fd, self.size)
                except OSError:
                    pass
            self.allocated = self.size
            fds = (self.fd, self._index_fd, self._timeindex_fd)
            self.fd = self._index_fd = self._timeindex_fd = -1
        for fd in fds:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.txn_index.close()

    def change_suffix(self, suffix: str) -> None:
        """Rename the segment's files to end in ``suffix`` (Kafka's changeFileSuffixes); the
        open descriptors stay valid. The log file last: while it has the old name, a crash
        leaves the segment where it was (the indexes are rebuilt when missing)."""
        moves = [(self.index_path, ".index"), (self.timeindex_path, ".timeindex"),
                 (self.txn_index.path, ".txnindex"), (self.log_path, ".log")]
        for path, ext in moves:
            target = self.directory / segment_name(self.base_offset, ext + suffix)
            try:
                os.replace(path, target)
            except FileNotFoundError:
                if ext == ".log":
                    raise
        self.suffix = suffix
        self.log_path = self.directory / segment_name(self.base_offset, ".log" + suffix)
        self.index_path = self.directory / segment_name(self.base_offset, ".index" + suffix)
        self.timeindex_path = self.directory / segment_name(self.base_offset,
                                                            ".timeindex" + suffix)
        self.txn_index.path = self.directory / segment_name(self.base_offset,
                                                            ".txnindex" + suffix)

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path, self.timeindex_path):
            path.unlink(missing_ok=True)
        self.txn_index.delete()

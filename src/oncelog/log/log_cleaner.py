"""The log cleaner at work (Kafka's LogCleaner and Cleaner.doClean / cleanSegments): a
cleaning of one compacted log in three steps, and the background thread that runs them.

1. ``plan`` (on the thread that owns the log: the broker's event loop) takes what the
   cleaning needs while nothing moves: the segments of the cleanable range with a duplicate
   of each file descriptor (their bytes stay readable even if retention or a truncation
   deletes them meanwhile), the aborted transactions of that range, the producers' last
   batches, the configs.
2. ``clean`` (on the cleaner's own thread) builds the offset map over the dirty section and
   writes each group of segments, cleaned by log/cleaner.py's rules, into a new segment whose
   files end in ``.cleaned``, fsynced.
3. ``swap`` (back on the log's thread) checks that the log still holds those segments
   unchanged and replaces them group by group, lowest offsets first, as Kafka's
   replaceSegments: the new files are renamed to ``.swap``, the old segment deleted, the
   ``.swap`` files renamed to their final names. A crash leaves ``.cleaned`` files (the
   loader deletes them: the old segments are whole) or ``.swap`` files (the loader finishes
   the swap: log/loader.py ``finish_swaps``), never a lost record.

Appends, fetches and truncations never wait for step 2.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..records.batch import HEADER_SIZE, BatchHeader, parse_header
from .cleaner import (
    CleanedTransactionMetadata,
    CleanerStats,
    LastRecord,
    clean_batch,
    group_segments,
    map_batch,
)
from .cleaner_manager import MAX_LONG, CleanerManager, CompactedLog, LogToClean
from .offset_map import OffsetMap
from .segment import LogSegment
from .txn_index import AbortedTxn

log = logging.getLogger("oncelog.log.cleaner")

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
READ_CHUNK = 4 << 20
WRITE_CHUNK = 1 << 20
_LENGTH = struct.Struct(">i")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CleaningAborted(Exception):
    """The cleaner is stopping (the broker shuts down): the cleaning is given up."""


class Throttler:
    """``log.cleaner.io.max.bytes.per.second``: sleeps when the cleaner reads or writes faster;
    and gives the cleaning up when ``stop`` is set (Kafka's checkDone)."""

    def __init__(self, bytes_per_second: int, stop: threading.Event | None = None) -> None:
        self.rate = bytes_per_second
        self.stop = stop
        self.start = time.monotonic()
        self.done = 0

    def maybe_throttle(self, n: int) -> None:
        if self.stop is not None and self.stop.is_set():
            raise CleaningAborted()
        self.done += n
        if self.rate >= MAX_LONG:
            return
        ahead = self.done / self.rate - (time.monotonic() - self.start)
        if ahead > 0.01:
            time.sleep(ahead)


@dataclass
class SourceSegment:
    segment: LogSegment
    fd: int  # the cleaner's own duplicate
    size: int
    base_offset: int
    next_offset: int


@dataclass
class CleaningPlan:
    name: str
    log: CompactedLog
    directory: Path
    sources: list[SourceSegment]
    first_dirty_offset: int
    first_uncleanable_offset: int
    aborted: list[AbortedTxn]
    active_producers: dict[int, LastRecord]
    segment_bytes: int
    index_interval_bytes: int
    delete_retention_ms: int
    now_ms: int
    generation: int

    def close(self) -> None:
        for s in self.sources:
            if s.fd >= 0:
                os.close(s.fd)
                s.fd = -1


@dataclass
class CleanedGroup:
    old: list[LogSegment]
    new: LogSegment


@dataclass
class CleanResult:
    plan: CleaningPlan
    end_offset: int
    groups: list[CleanedGroup] = field(default_factory=list)
    stats: CleanerStats = field(default_factory=CleanerStats)
    next_horizon_ms: int = MAX_LONG

    def discard(self) -> None:
        for g in self.groups:
            g.new.delete()
        self.groups = []


def plan(ltc: LogToClean, now_ms: int) -> CleaningPlan | None:
    """Step 1, on the log's thread."""
    plog = ltc.log
    segs = [s for s in plog.segments[:-1] if s.base_offset < ltc.first_uncleanable_offset]
    if not segs:
        return None
    sources = [SourceSegment(s, os.dup(s.fd), s.size, s.base_offset, s.next_offset)
               for s in segs]
    end = max(s.next_offset for s in sources)
    producers = {pid: LastRecord(e.last_offset if e.batches else None, e.producer_epoch)
                 for pid, e in plog.producer_state.producers.items()}
    cfg = plog.config
    return CleaningPlan(
        ltc.name, plog, plog.directory, sources, ltc.first_dirty_offset,
        ltc.first_uncleanable_offset,
        plog.aborted_transactions(plog.log_start_offset, end),
        producers, cfg.segment_bytes, cfg.index_interval_bytes,
        cfg.delete_retention_ms, now_ms, plog.generation)


def read_batches(fd: int, size: int, throttler: Throttler | None = None
                 ) -> Iterator[tuple[bytes, int, BatchHeader]]:
    """(buffer, position, header) of each batch in the first ``size`` bytes of a segment
    file, read a few MB at a time."""
    file_pos = 0
    while file_pos < size:
        buf = os.pread(fd, min(READ_CHUNK, size - file_pos), file_pos)
        if len(buf) < HEADER_SIZE:
            raise OSError(f"segment shorter than expected at byte {file_pos}")
        if throttler is not None:
            throttler.maybe_throttle(len(buf))
        pos = 0
        while len(buf) - pos >= HEADER_SIZE:
            h = parse_header(buf, pos)
            if h.size < HEADER_SIZE:
                raise OSError(f"bad batch length at byte {file_pos + pos}")
            if pos + h.size > len(buf):
                break
            yield buf, pos, h
            pos += h.size
        if pos == 0:  # one batch larger than the chunk
            (length,) = _LENGTH.unpack_from(buf, 8)
            buf = os.pread(fd, length + 12, file_pos)
            h = parse_header(buf, 0)
            if len(buf) < h.size:
                raise OSError(f"segment shorter than expected at byte {file_pos}")
            yield buf, 0, h
            pos = h.size
        file_pos += pos


def clean(p: CleaningPlan, offset_map: OffsetMap, throttler: Throttler | None = None
          ) -> CleanResult:
    """Step 2, on the cleaner's thread: the offset map, then the cleaned segments."""
    stats = CleanerStats()
    offset_map.clear()
    # The offset map over the dirty section, until it is full (Kafka's buildOffsetMap).
    # Only the aborted transactions that reach into the dirty section: the markers of those
    # that ended before it are not read here (Kafka's collectAbortedTransactions(start, end)).
    txn = CleanedTransactionMetadata([a for a in p.aborted
                                      if a.last_offset >= p.first_dirty_offset])
    full = False
    for src in p.sources:
        if src.next_offset <= p.first_dirty_offset or full:
            continue
        for buf, pos, h in read_batches(src.fd, src.size, throttler):
            if h.last_offset < p.first_dirty_offset:
                continue
            if not map_batch(buf, pos, h, txn, offset_map, p.first_dirty_offset, stats):
                full = True
                break
    # The clean section is covered too: its records are judged by the map.
    offset_map.latest_offset = max(offset_map.latest_offset, p.first_dirty_offset - 1)
    end = offset_map.latest_offset + 1
    result = CleanResult(p, end, stats=stats)
    todo = [s for s in p.sources if s.base_offset < end]
    txn = CleanedTransactionMetadata(p.aborted)
    try:
        for group in group_segments([(s.base_offset, s.size, s.next_offset) for s in todo],
                                    p.segment_bytes):
            srcs = [todo[i] for i in group]
            new = _clean_group(p, srcs, offset_map, txn, result, throttler)
            result.groups.append(CleanedGroup([s.segment for s in srcs], new))
    except BaseException:
        result.discard()
        raise
    return result


def _clean_group(p: CleaningPlan, srcs: list[SourceSegment], offset_map: OffsetMap,
                 txn: CleanedTransactionMetadata, result: CleanResult,
                 throttler: Throttler | None) -> LogSegment:
    base = srcs[0].base_offset
    for path in p.directory.glob(f"{base:020d}.*{CLEANED_SUFFIX}"):
        path.unlink(missing_ok=True)  # a cleaning of this log cut short earlier
    new = LogSegment(p.directory, base, p.index_interval_bytes, p.now_ms, CLEANED_SUFFIX)
    try:
        new.load(recover=True)
        out = bytearray()
        headers: list[tuple[int, BatchHeader]] = []

        def write() -> None:
            if out:
                new.append([out], headers)
                if throttler is not None:
                    throttler.maybe_throttle(len(out))
                out.clear()
                headers.clear()

        for src in srcs:
            for buf, pos, h in read_batches(src.fd, src.size, throttler):
                kept, entry = clean_batch(
                    buf, pos, h, offset_map=offset_map, txn=txn,
                    active_producers=p.active_producers, now_ms=p.now_ms,
                    delete_retention_ms=p.delete_retention_ms, stats=result.stats)
                if kept is None:
                    continue
                kh = parse_header(kept, 0)
                # The next pass that may remove something: the earliest horizon still ahead
                # (one already passed stays only beyond the offset map's reach).
                if kh.delete_horizon_ms is not None and kh.delete_horizon_ms > p.now_ms:
                    result.next_horizon_ms = min(result.next_horizon_ms, kh.delete_horizon_ms)
                if entry is not None:
                    write()  # the entry's marker first, so that the index follows the log
                headers.append((len(out), kh))
                out += kept
                if entry is not None:
                    write()
                    new.txn_index.append(entry)
                if len(out) >= WRITE_CHUNK:
                    write()
        write()
        new.trim()
        new.flush()
    except BaseException:
        new.delete()
        raise
    return new


def swap(result: CleanResult) -> bool:
    """Step 3, on the log's thread: replace each group's old segments by its cleaned one,
    lowest offsets first (a crash between two groups leaves a log whose lower part is cleaned,
    which is consistent: a record only goes when a later one of its key stays). False, and
    nothing replaced, when the log changed under the cleaning (truncated, segments deleted,
    closed)."""
    p = result.plan
    plog = p.log
    segments = plog.segments
    if plog.generation != p.generation or not segments or segments[0].fd < 0:
        result.discard()
        return False
    for g in result.groups:
        try:
            i = next(k for k, s in enumerate(segments) if s is g.old[0])
        except StopIteration:
            result.discard()
            return False
        if segments[i:i + len(g.old)] != g.old or i + len(g.old) >= len(segments):
            result.discard()
            return False
    src_sizes = {id(s.segment): s.size for s in p.sources}
    if any(s.size != src_sizes[id(s)] for g in result.groups for s in g.old):
        result.discard()
        return False
    for g in result.groups:
        i = next(k for k, s in enumerate(segments) if s is g.old[0])
        g.new.change_suffix(SWAP_SUFFIX)
        fsync_dir(p.directory)
        for s in g.old:
            s.delete()
        g.new.change_suffix("")
        fsync_dir(p.directory)
        segments[i:i + len(g.old)] = [g.new]
    result.groups = []
    return True


def clean_log(manager: CleanerManager, ltc: LogToClean, now_ms: int, memory_bytes: int,
              throttler: Throttler | None = None) -> CleanResult | None:
    """All three steps on the caller's thread (tests, tools): the cleaning of one log."""
    p = plan(ltc, now_ms)
    if p is None:
        manager.done_cleaning(ltc.log, None, MAX_LONG)
        return None
    try:
        result = clean(p, OffsetMap(memory_bytes), throttler)
    except BaseException:
        manager.done_cleaning(ltc.log, None, MAX_LONG)
        raise
    finally:
        p.close()
    ok = swap(result)
    manager.done_cleaning(ltc.log, result.end_offset if ok else None, result.next_horizon_ms)
    return result if ok else None


class LogCleaner:
    """The background cleaner (Kafka's LogCleaner with its CleanerThreads): one thread that
    picks the filthiest compacted log every ``backoff_ms`` (at once again after a cleaning),
    plans and swaps on the event loop, and cleans in between on its own. ``logs`` is called
    on the loop and yields (name, PartitionLog) pairs."""

    def __init__(self, logs: Callable[[], Iterable[tuple[str, CompactedLog]]], *,
                 memory_bytes: int, backoff_ms: int, io_bytes_per_second: int = MAX_LONG,
                 clock: Callable[[], int] | None = None) -> None:
        self.logs = logs
        self.manager = CleanerManager()
        self.offset_map = OffsetMap(memory_bytes)
        self.backoff_ms = backoff_ms
        self.io_bytes_per_second = io_bytes_per_second
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.stats = CleanerStats()
        self.cleanings = 0
        # Kafka's LogCleaner metrics of the last cleaning (cleaner-recopy-percent,
        # max-buffer-utilization-percent, max-clean-time-secs).
        self.last_recopy_percent = 0.0
        self.last_buffer_utilization_percent = 0.0
        self.last_clean_secs = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name="log-cleaner", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Look for work now (tests; a config change)."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _on_loop(self, fn: Callable[[], object]) -> object:
        assert self._loop is not None
        fut: concurrent.futures.Future = concurrent.futures.Future()

        def call() -> None:
            try:
                fut.set_result(fn())
            except Exception as exc:  # noqa: BLE001 (handed to the cleaner's thread, which logs it)
                fut.set_exception(exc)

        self._loop.call_soon_threadsafe(call)
        while True:
            try:
                return fut.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if self._stop.is_set() or self._loop.is_closed():
                    raise RuntimeError("the broker is stopping") from None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cleaned = self.clean_filthiest()
            except RuntimeError:
                if self._stop.is_set():
                    return
                log.exception("the log cleaner failed")
                cleaned = False
            except Exception:
                log.exception("the log cleaner failed")
                cleaned = False
            if not cleaned:
                self._wake.wait(self.backoff_ms / 1000)
                self._wake.clear()

    def clean_filthiest(self) -> bool:
        """One round on the cleaner's thread: True when a log was cleaned."""
        def pick() -> CleaningPlan | None:
            now = self.clock()
            ltc = self.manager.grab_filthiest(self.logs(), now)
            if ltc is None:
                return None
            try:
                p = plan(ltc, now)
            except BaseException:
                self.manager.done_cleaning(ltc.log, None, MAX_LONG)
                raise
            if p is None:
                self.manager.done_cleaning(ltc.log, None, MAX_LONG)
            return p

        p = self._on_loop(pick)
        if p is None:
            return False
        assert isinstance(p, CleaningPlan)
        result: CleanResult | None = None
        try:
            started = time.monotonic()
            result = clean(p, self.offset_map, Throttler(self.io_bytes_per_second, self._stop))
        except CleaningAborted:
            return False
        except OSError as exc:
            log.warning("cleaning %s stopped: %s", p.name, exc)
        except Exception:
            log.exception("cleaning %s failed: it is not cleaned again until the broker "
                          "restarts", p.name)
            self._on_loop(lambda: self.manager.mark_uncleanable(p.log))
            return False
        finally:
            p.close()
        if result is None:
            self._on_loop(lambda: self.manager.done_cleaning(p.log, None, MAX_LONG))
            return False
        res = result

        def finish() -> bool:
            try:
                ok = swap(res)
            except OSError:
                # A rename or delete failed midway (a failing disk): no retry on this log.
                self.manager.mark_uncleanable(p.log)
                res.discard()
                raise
            self.manager.done_cleaning(p.log, res.end_offset if ok else None,
                                       res.next_horizon_ms)
            return ok

        try:
            ok = bool(self._on_loop(finish))
        except RuntimeError:
            res.discard()  # the broker stopped first: the loader deletes what is left
            raise
        if ok:
            self.cleanings += 1
            self.stats.add(res.stats)
            secs = time.monotonic() - started
            self.last_clean_secs = secs
            self.last_recopy_percent = 100.0 * res.stats.bytes_written / max(
                res.stats.bytes_read, 1)
            self.last_buffer_utilization_percent = 100.0 * self.offset_map.utilization
            log.info("cleaned %s up to offset %d: %d of %d bytes kept in %.2f s", p.name,
                     res.end_offset, res.stats.bytes_written, res.stats.bytes_read, secs)
        return ok

    def dirty_and_uncleanable(self) -> tuple[float, int]:
        """On the event loop: the highest dirty ratio of a compacted log (Kafka's
        max-dirty-percent, as a fraction) and how many compacted logs the cleaner gave up on
        (uncleanable-partitions-count)."""
        now = self.clock()
        worst, uncleanable = 0.0, 0
        for name, plog in self.logs():
            if plog.config.compact:
                worst = max(worst, self.manager.log_to_clean(name, plog, now).cleanable_ratio)
                uncleanable += self.manager.state(plog).uncleanable
        return worst, uncleanable

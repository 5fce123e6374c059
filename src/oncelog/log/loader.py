"""Opening a partition's log (Kafka's LogLoader): the segments, validated where they may hold
unflushed data after an unclean stop; the leader-epoch cache made consistent with them; the
producer state from the latest readable snapshot and the batches after it; and the small
checkpoint files beside them (``recovery-point``, ``high-watermark``).

``PartitionLog`` (log/log.py) calls these while it opens, and again after a truncation; they
read and set the log's own fields, so they run on the broker's event loop like the log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from ..records.batch import HEADER_SIZE, BatchHeader, parse_header
from .leader_epoch import CHECKPOINT_FILE, LeaderEpochCache, read_checkpoint
from .log_config import MAX_LONG
from .producer_state import ProducerStateManager
from .segment import LogSegment

CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
RECOVERY_POINT_FILE = "recovery-point"
HIGH_WATERMARK_FILE = "high-watermark"

log = logging.getLogger("oncelog.log")


class PartitionLog(Protocol):
    """What loading needs of log/log.py's PartitionLog (named here, not imported: the log
    imports its loader, not the other way round)."""

    directory: Path
    config: Any
    segments: list[LogSegment]
    recovered_bytes: int
    _recovered_from: int | None
    producer_state: ProducerStateManager

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def iter_headers_from(self, offset: int) -> Iterator[tuple[LogSegment, int, BatchHeader]]: ...

    def _replay_marker(self, seg: LogSegment, h: BatchHeader, buf: Any, pos: int) -> None: ...


def read_offset_file(path: Path) -> int | None:
    """An offset checkpoint (one decimal number); None when missing or unreadable."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def write_offset_file(path: Path, offset: int) -> None:
    """Replace ``path`` atomically: a crash leaves the old value or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(offset))
    os.replace(tmp, path)


def load_segments(plog: PartitionLog, now_ms: int) -> None:
    """Open ``plog``'s segments into ``plog.segments`` (appended one by one, so a failed load
    still closes what it opened). A segment is validated if it may hold unflushed data: the one
    holding the recovery point and every later one after an unclean shutdown, and always the
    last. Sets ``recovered_bytes`` and ``_recovered_from``."""
    directory = plog.directory
    finish_swaps(directory)
    clean_marker = directory / CLEAN_SHUTDOWN_FILE
    clean = clean_marker.exists()
    recovery_point = MAX_LONG if clean else (
        read_offset_file(directory / RECOVERY_POINT_FILE) or 0)
    bases = sorted(int(p.name[:-4]) for p in directory.glob("*.log") if p.name[:-4].isdigit())
    segments = plog.segments
    for base in bases:
        segments.append(LogSegment(directory, base, plog.config.index_interval_bytes, now_ms))
    for i, seg in enumerate(segments):
        is_last = i == len(segments) - 1
        next_base = segments[i + 1].base_offset if not is_last else MAX_LONG
        recover = is_last or next_base > recovery_point
        if recover and not clean and plog._recovered_from is None:
            plog._recovered_from = seg.base_offset
        truncated = seg.load(recover=recover)
        plog.recovered_bytes += truncated
        if truncated and recover and not is_last:
            # Unflushed data after a corrupt batch cannot be trusted: drop the later
            # segments. (A flushed segment validated only because its index was wrong keeps
            # its successors, with a gap where the cut went, as Kafka's LogLoader does.)
            later = segments[i + 1 :]
            log.warning("Recovery of %s: deleting the %d segment(s) after the cut, "
                        "which held offsets %d and up (%d bytes; segments %s)",
                        directory, len(later), later[0].base_offset,
                        sum(s.size for s in later),
                        ", ".join(str(s.base_offset) for s in later))
            for seg_after in later:
                seg_after.delete()
            del segments[i + 1 :]
            break
    if not segments:
        seg = LogSegment(directory, 0, plog.config.index_interval_bytes, now_ms)
        segments.append(seg)  # before load: a failed load must still close its file
        seg.load(recover=True)
    clean_marker.unlink(missing_ok=True)


def _last_offset(path: Path) -> int | None:
    """The last offset of the whole batches at the start of a segment file, None if none."""
    last = None
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        h = parse_header(data, pos)
        if h.size < HEADER_SIZE or pos + h.size > len(data):
            break
        last = h.last_offset
        pos += h.size
    return last


def finish_swaps(directory: Path) -> None:
    """A log cleaning cut short by a crash (log/log_cleaner.py): ``.cleaned`` files are a
    cleaning not yet swapped in (the segments they would replace are whole): deleted. A
    ``<base>.log.swap`` is a cleaned segment whose swap began: the old segments it replaces
    (those starting within its offsets) are deleted if any is left and the ``.swap`` files
    take their final names, as Kafka's LogLoader does. The indexes of a finished swap are
    rebuilt if they did not make it."""
    try:
        names = [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]
    except FileNotFoundError:
        return
    if not names:
        return  # one listing per log at startup: the usual case costs no more
    for name in names:
        if name.endswith(".cleaned"):
            (directory / name).unlink(missing_ok=True)
    swaps = sorted(int(n[:20]) for n in names if n.endswith(".log.swap") and n[:20].isdigit())
    for base in swaps:
        swap_log = directory / f"{base:020d}.log.swap"
        last = _last_offset(swap_log)
        last = base if last is None else last
        log.warning("%s: finishing the swap of cleaned segment %d (offsets up to %d) that a "
                    "crash interrupted", directory, base, last)
        olds = {f"{base:020d}"}  # its own base: whatever a cut-short delete left of the old
        olds.update(p.name[:-4] for p in directory.glob("*.log")
                    if p.name[:-4].isdigit() and base <= int(p.name[:-4]) <= last)
        for old in olds:
            for ext in (".log", ".index", ".timeindex", ".txnindex"):
                (directory / f"{old}{ext}").unlink(missing_ok=True)
        for ext in (".index", ".timeindex", ".txnindex", ".log"):
            swapped = directory / f"{base:020d}{ext}.swap"
            if swapped.exists():
                os.replace(swapped, directory / f"{base:020d}{ext}")
    for path in directory.glob("*.swap"):
        path.unlink(missing_ok=True)  # the indexes of a swap whose log never got its name


def read_high_watermark(plog: PartitionLog) -> int:
    """The stored high watermark, clamped to the log; the log start when none is stored."""
    hw = read_offset_file(plog.directory / HIGH_WATERMARK_FILE)
    if hw is None:
        hw = plog.log_start_offset
    return max(plog.log_start_offset, min(hw, plog.log_end_offset))


def load_leader_epoch_cache(plog: PartitionLog) -> LeaderEpochCache:
    """The checkpoint file, made consistent with the log as Kafka's LogLoader does: entries
    past the log end dropped, the first moved up to the log start, and the epochs of batches
    recovered after an unclean stop added. A log whose file is missing or damaged rebuilds it
    from its batches' partitionLeaderEpoch fields (one header read per batch).
    """
    path = plog.directory / CHECKPOINT_FILE
    entries = read_checkpoint(path)
    rebuild_from: int | None = None
    if entries is None:
        rebuild_from = plog.log_start_offset
    elif plog._recovered_from is not None:
        rebuild_from = plog._recovered_from
    cache = LeaderEpochCache(path, entries or ())
    if rebuild_from is not None:
        latest = cache.latest_epoch
        for _seg, _pos, h in plog.iter_headers_from(rebuild_from):
            epoch = h.partition_leader_epoch
            if epoch >= 0 and (latest is None or epoch > latest):
                cache.assign(epoch, h.base_offset, flush=False)
                latest = epoch
        if (entries is None and cache.entries) or \
                (entries is not None and cache.entries != entries):
            cache.flush()  # (an empty rebuild of a missing file stays missing: same meaning)
    cache.truncate_from_end(plog.log_end_offset)
    cache.truncate_from_start(plog.log_start_offset)
    return cache


def snapshot_files(directory: Path) -> list[tuple[int, Path]]:
    """The producer-state snapshots (``<20-digit offset>.snapshot``), oldest first."""
    out = []
    for p in directory.glob("*.snapshot"):
        stem = p.name[: -len(".snapshot")]
        if stem.isdigit():
            out.append((int(stem), p))
    return sorted(out)


def load_producer_state(plog: PartitionLog) -> None:
    """Latest readable snapshot at or below the log end, then replay the log after it."""
    end = plog.log_end_offset
    start_offset = plog.log_start_offset
    state = None
    for offset, path in reversed(snapshot_files(plog.directory)):
        if offset > end:
            path.unlink(missing_ok=True)  # stale: the log was truncated below it
            continue
        try:
            state = ProducerStateManager.from_snapshot(path.read_bytes())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)  # damaged: fall back to an older one or the log
            continue
        start_offset = max(offset, plog.log_start_offset)
        break
    plog.producer_state = state or ProducerStateManager()
    for seg, pos, h in plog.iter_headers_from(start_offset):
        if not h.is_control:
            plog.producer_state.update(h)
        else:
            plog._replay_marker(seg, h, os.pread(seg.fd, h.size, pos), 0)

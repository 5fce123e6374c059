"""The aborted-transaction index of one segment: spec 000, "Aborted Transaction Index".

A ``<20-digit base offset>.txnindex`` file beside the segment, one fixed-size entry per aborted
transaction whose ABORT marker landed in that segment, in marker order:

    TransactionEntry => Version => int16, PID => int64, FirstOffset => int64,
                        LastOffset => int64, LastStableOffset => int64

FirstOffset is the offset of the producer's first batch in the transaction, LastOffset the
marker's offset, LastStableOffset the partition's LSO once the marker was written. A
read_committed fetch gets every aborted transaction that intersects the fetched range, so that
the consumer can drop those producers' batches (spec 000, "Consumer").

The index is derived data: entries past the log end are cut when the log is truncated, and the
log rebuilds missing entries when it replays markers (log/log.py).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

_ENTRY = struct.Struct(">hqqqq")
ENTRY_VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []
        self._fd = -1

    def load(self) -> None:
        """Read the entries; a torn or damaged tail (a crash mid-write) is cut off."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        entries: list[AbortedTxn] = []
        for pos in range(0, len(raw) - _ENTRY.size + 1, _ENTRY.size):
            version, pid, first, last, lso = _ENTRY.unpack_from(raw, pos)
            if version != ENTRY_VERSION or not 0 <= first <= last:
                break
            entries.append(AbortedTxn(pid, first, last, lso))
        self.entries = entries
        if len(raw) != len(entries) * _ENTRY.size:
            self._rewrite()

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        return self._fd

    def _rewrite(self) -> None:
        self.close()
        tmp = self.path.with_suffix(".txnindex.tmp")
        with open(tmp, "wb") as f:
            f.writelines(_ENTRY.pack(ENTRY_VERSION, *e) for e in self.entries)
        os.replace(tmp, self.path)

    def append(self, entry: AbortedTxn) -> None:
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            raise ValueError(f"aborted transaction at {entry.last_offset} is not after "
                             f"{self.entries[-1].last_offset}")
        self.entries.append(entry)
        os.write(self._open(), _ENTRY.pack(ENTRY_VERSION, *entry))

    def contains(self, last_offset: int) -> bool:
        return any(e.last_offset == last_offset for e in reversed(self.entries))

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of markers at or after ``offset``."""
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def collect(self, start_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
        """Entries of transactions that intersect [start_offset, upper_bound_offset)."""
        return [e for e in self.entries
                if e.last_offset >= start_offset and e.first_offset < upper_bound_offset]

    def flush(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)

"""A partition's leader-epoch cache: Kafka's LeaderEpochFileCache (KIP-101, KIP-279).

An ordered list of ``(epoch, start offset)`` entries: the first offset of the log written in each
leader epoch. A follower that becomes one asks the leader for the end offset of its latest epoch
(OffsetForLeaderEpoch, answered by ``end_offset_for``) and truncates its log there, so that the
replicas of a partition never diverge after a leader change.

Persisted in ``leader-epoch-checkpoint`` in the partition directory, in Kafka's checkpoint file
format (version 0, the number of entries, one ``<epoch> <start offset>`` line per entry)::

    0
    2
    0 0
    3 1200

written to ``leader-epoch-checkpoint.tmp``, fsynced and renamed over the old file, so a crash
leaves the old or the new list, never a torn one. The log (log/log.py) keeps the cache consistent
with itself: entries past the log end are cut when the log is opened or truncated, the first
entry is moved up to the log start when old segments go; a missing or damaged file is rebuilt
from the partitionLeaderEpoch fields of the log's batches.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

CHECKPOINT_FILE = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

__all__ = [
    "CHECKPOINT_FILE",
    "UNDEFINED_EPOCH",
    "UNDEFINED_EPOCH_OFFSET",
    "EpochEntry",
    "LeaderEpochCache",
    "read_checkpoint",
]


class EpochEntry(NamedTuple):
    epoch: int
    start_offset: int


def read_checkpoint(path: Path) -> list[EpochEntry] | None:
    """The entries of a checkpoint file; None when it is missing or damaged (bad version, wrong
    count, unparsable line, epochs not increasing or start offsets decreasing)."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    try:
        if len(lines) < 2 or int(lines[0]) != CHECKPOINT_VERSION:
            return None
        count = int(lines[1])
        if count < 0 or len(lines) != 2 + count:
            return None
        entries: list[EpochEntry] = []
        for line in lines[2:]:
            parts = line.split(" ")
            if len(parts) != 2:
                return None
            entry = EpochEntry(int(parts[0]), int(parts[1]))
            if entry.epoch < 0 or entry.start_offset < 0:
                return None
            if entries and (entry.epoch <= entries[-1].epoch
                            or entry.start_offset < entries[-1].start_offset):
                return None
            entries.append(entry)
    except ValueError:
        return None
    return entries


def _format(entries: Iterable[EpochEntry]) -> str:
    items = list(entries)
    lines = [str(CHECKPOINT_VERSION), str(len(items))]
    lines.extend(f"{e.epoch} {e.start_offset}" for e in items)
    return "\n".join(lines) + "\n"


class LeaderEpochCache:
    """(epoch, start offset) entries, epochs strictly increasing, start offsets non-decreasing.

    Every change is written through to the checkpoint file at ``path`` (when ``path`` is None the
    cache lives in memory only). Single-threaded, like the log that owns it.
    """

    def __init__(self, path: Path | None, entries: Iterable[EpochEntry | tuple[int, int]] = ()
                 ) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._starts: list[int] = []
        for epoch, start in entries:
            self._assign(epoch, start)

    @classmethod
    def load(cls, path: Path) -> LeaderEpochCache | None:
        """The cache stored at ``path``, or None when the file is missing or damaged."""
        entries = read_checkpoint(path)
        return None if entries is None else cls(path, entries)

    # -- reading ------------------------------------------------------------------------------

    @property
    def entries(self) -> list[EpochEntry]:
        return [EpochEntry(e, s) for e, s in zip(self._epochs, self._starts)]

    def __len__(self) -> int:
        return len(self._epochs)

    @property
    def latest_epoch(self) -> int | None:
        """The latest epoch (the one being written to), or None when the cache is empty."""
        return self._epochs[-1] if self._epochs else None

    @property
    def latest_entry(self) -> EpochEntry | None:
        return EpochEntry(self._epochs[-1], self._starts[-1]) if self._epochs else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return EpochEntry(self._epochs[0], self._starts[0]) if self._epochs else None

    def start_offset_of(self, epoch: int) -> int | None:
        """The start offset of exactly ``epoch``, or None if the cache has no such entry."""
        i = bisect.bisect_left(self._epochs, epoch)
        if i < len(self._epochs) and self._epochs[i] == epoch:
            return self._starts[i]
        return None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch the record at ``offset`` was written in (Kafka's epochForOffset): the epoch
        of the last entry starting at or before it; None if it lies before the first entry."""
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._epochs[i] if i >= 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's endOffsetFor, the answer to OffsetForLeaderEpoch: (the largest epoch <=
        ``requested_epoch``, the start offset of the first epoch above it).

        - requested UNDEFINED (-1), or above every epoch here without being the latest:
          (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        - requested == the latest epoch: (latest, ``log_end_offset``);
        - requested below the first epoch here (its entries went with old segments): (requested,
          start offset of the first epoch), as Kafka answers since 2.1 (1.x answered UNDEFINED,
          which made the follower fall back to truncating to its high watermark): the follower
          truncates there and replicates from the leader's log start;
        - otherwise: (largest epoch <= requested, start offset of the next epoch).
        """
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._epochs and self._epochs[-1] == requested_epoch:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher >= len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return requested_epoch, self._starts[0]
        return self._epochs[higher - 1], self._starts[higher]

    # -- changing -----------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` (Kafka's assign): nothing if it is
        already the latest epoch and starts no later; otherwise every entry whose epoch is >=
        ``epoch`` or whose start offset is >= ``start_offset`` is dropped and the entry appended.
        Returns whether the cache changed; the file is rewritten then, unless ``flush`` is
        False (the caller flushes after a run of assignments)."""
        epochs = self._epochs
        if epochs and epoch == epochs[-1] and start_offset >= self._starts[-1] >= 0:
            return False  # every append of a leader: its epoch is the latest already
        if not self._assign(epoch, start_offset):
            return False
        if flush:
            self.flush()
        return True

    def _assign(self, epoch: int, start_offset: int) -> bool:
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry ({epoch}, {start_offset})")
        if self._epochs and epoch == self._epochs[-1] and start_offset >= self._starts[-1]:
            return False
        while self._epochs and (self._epochs[-1] >= epoch or self._starts[-1] >= start_offset):
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop the entries that start at or after ``end_offset`` (the log was cut there)."""
        if end_offset < 0 or not self._starts or self._starts[-1] < end_offset:
            return False
        while self._starts and self._starts[-1] >= end_offset:
            self._epochs.pop()
            self._starts.pop()
        self.flush()
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at ``start_offset``: entries starting at or before it are replaced
        by one entry of the last of them, starting at ``start_offset`` (Kafka's
        truncateFromStart: an entry starting exactly there is kept as it is)."""
        n = bisect.bisect_right(self._starts, start_offset)
        if n == 0:
            return False
        epoch = self._epochs[n - 1]
        if n == 1 and self._starts[0] == start_offset:
            return False
        del self._epochs[:n]
        del self._starts[:n]
        self._epochs.insert(0, epoch)
        self._starts.insert(0, start_offset)
        self.flush()
        return True

    def clear(self) -> None:
        self._epochs.clear()
        self._starts.clear()
        self.flush()

    def flush(self) -> None:
        """Write the checkpoint file atomically (tmp file, fsync, rename)."""
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="ascii") as f:
            f.write(_format(self.entries))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

"""The log cleaner's decisions, sans IO: which records and batches a compaction keeps (Kafka's
Cleaner.cleanInto with its RecordFilter, CleanedTransactionMetadata and MemoryRecords.filterTo).

Bytes of batches go in, bytes of the batches to keep come out; nothing here opens a file or
reads a clock (the caller passes ``now_ms``). log/log_cleaner.py reads the segments, writes
the cleaned ones and swaps them in; log/cleaner_manager.py decides which log to clean when.

The rules (spec 000, "Compacting Transactional Data"; KIP-534 for the delete horizon):

- A data record is kept when it is the latest of its key in the offset map (built from the
  dirty section, aborted transactions left out), or lies beyond what the map covered. A
  record without a key is dropped (a compacted topic refuses them at append).
- Every batch of an aborted transaction goes (the aborted-transaction index names them).
- A tombstone (a null value) is kept until the batch's delete horizon has passed: the first
  pass that sees it stamps ``now + delete.retention.ms`` into the batch (the base timestamp and
  the delete-horizon attribute), a later pass after that time removes it, so that a consumer
  that read the key's older value has that long to see the deletion.
- A COMMIT or ABORT marker is never deduplicated by key. It may go once no batch of its
  transaction is left (the pass that finds none stamps its horizon), and goes in a later pass
  once that horizon has passed: a read_committed consumer still inside that range must see
  the marker of an aborted transaction whose data it is filtering.
- A batch emptied by all this is dropped, except the one holding a producer's last sequence
  (or, for a producer whose last entry is a marker, that marker's epoch): its header is kept
  with no records, so that the producer state rebuilt from the log after a restart still
  knows the producer (spec 000, "Discussion on PID Expiration for Compacted Topics"). A
  batch that loses records keeps its offsets range (lastOffsetDelta) for the same reason.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple

from ..records.batch import (
    ATTR_DELETE_HORIZON,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    INT64_MAX,
    BatchHeader,
    CorruptRecordError,
    Record,
    decode_batch,
    empty_batch,
    parse_control_record,
    rebuild_batch,
    record_keys,
)
from .offset_map import OffsetMap
from .txn_index import AbortedTxn


class LastRecord(NamedTuple):
    """What the producer state says of an active producer (Kafka's LastRecord): the last
    offset of its last data batch (None when its last entry is a marker) and its epoch."""

    last_data_offset: int | None
    producer_epoch: int


@dataclass
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    batches_read: int = 0
    batches_written: int = 0
    records_read: int = 0
    records_written: int = 0
    map_records: int = 0

    def add(self, other: CleanerStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class _AbortedTxnMetadata:
    __slots__ = ("aborted", "last_observed_batch_offset")

    def __init__(self, aborted: AbortedTxn) -> None:
        self.aborted = aborted
        self.last_observed_batch_offset: int | None = None


class CleanedTransactionMetadata:
    """The transactions a pass over the log is inside of, batch by batch (Kafka's class of the
    same name): which producers are in an aborted transaction (from the aborted-transaction
    index entries of the range, by first offset) and which in a committed one."""

    def __init__(self, aborted: list[AbortedTxn] = ()) -> None:  # type: ignore[assignment]
        self._aborted = [(a.first_offset, a.last_offset, a) for a in aborted]
        heapq.heapify(self._aborted)
        self._ongoing_aborted: dict[int, _AbortedTxnMetadata] = {}
        self._ongoing_committed: set[int] = set()

    def _consume_aborted_up_to(self, offset: int) -> None:
        while self._aborted and self._aborted[0][0] <= offset:
            a = heapq.heappop(self._aborted)[2]
            self._ongoing_aborted.setdefault(a.producer_id, _AbortedTxnMetadata(a))

    def on_batch_read(self, h: BatchHeader) -> bool:
        """A data batch: True when it belongs to an aborted transaction (discard it)."""
        self._consume_aborted_up_to(h.last_offset)
        if not h.is_transactional:
            return False
        meta = self._ongoing_aborted.get(h.producer_id)
        if meta is not None:
            meta.last_observed_batch_offset = h.last_offset
            return True
        self._ongoing_committed.add(h.producer_id)
        return False

    def on_control_batch_read(self, h: BatchHeader, records: list[Record]
                              ) -> tuple[bool, AbortedTxn | None]:
        """A control batch: (whether its transaction has nothing left, so the marker may go
        once its horizon passes; the aborted-transaction entry to keep beside it, if any)."""
        self._consume_aborted_up_to(h.last_offset)
        if not records:
            return True, None  # a marker already emptied by an earlier pass
        try:
            ctype, _epoch = parse_control_record(records[0])
        except CorruptRecordError:
            return False, None
        pid = h.producer_id
        if ctype == CONTROL_ABORT:
            meta = self._ongoing_aborted.pop(pid, None)
            if meta is not None and meta.last_observed_batch_offset is not None:
                # Data of the transaction was seen in this pass: keep the marker and its entry.
                return False, meta.aborted
            return True, None
        if ctype == CONTROL_COMMIT:
            seen = pid in self._ongoing_committed
            self._ongoing_committed.discard(pid)
            return not seen, None
        return False, None


def decode_or_empty(buf, pos: int, h: BatchHeader) -> list[Record]:
    if h.records_count == 0:
        return []
    return decode_batch(buf, pos, verify_crc=False)[1]


def map_batch(buf, pos: int, h: BatchHeader, txn: CleanedTransactionMetadata,
              offset_map: OffsetMap, start_offset: int, stats: CleanerStats) -> bool:
    """Put the keys of a dirty batch into the map (Kafka's buildOffsetMapForSegment). Control
    batches and aborted transactions are left out. False, and nothing put, when the map has
    no room for the batch's records: the pass then ends before it."""
    if h.is_control:
        txn.on_control_batch_read(h, decode_or_empty(buf, pos, h))
        return True
    if txn.on_batch_read(h):
        return True
    if len(offset_map) and not offset_map.room_for(h.records_count):
        return False
    for offset, key, _has_value in record_keys(buf, pos, h) if h.records_count else ():
        if key is not None and offset >= start_offset:
            offset_map.put(key, offset)
            stats.map_records += 1
    # Progress through batches that put nothing (no key, all before the start).
    offset_map.latest_offset = max(offset_map.latest_offset, h.last_offset)
    return True


def _retain_record(offset_map: OffsetMap, h: BatchHeader, offset: int, key: bytes | None,
                   has_value: bool, now_ms: int) -> bool:
    """Kafka's Cleaner.shouldRetainRecord for a v2 batch."""
    if offset > offset_map.latest_offset:
        return True  # not covered by this pass's map
    if key is None:
        return False
    if offset < offset_map.get(key):
        return False  # a later record of the key exists
    if has_value:
        return True
    horizon = h.delete_horizon_ms
    return horizon is None or now_ms < horizon


def clean_batch(buf, pos: int, h: BatchHeader, *, offset_map: OffsetMap,
                txn: CleanedTransactionMetadata, active_producers: dict[int, LastRecord],
                now_ms: int, delete_retention_ms: int, stats: CleanerStats
                ) -> tuple[bytes | memoryview | None, AbortedTxn | None]:
    """What the cleaned log keeps of one batch: its bytes unchanged, rebuilt with fewer
    records (or a delete horizon), its header alone, or None; plus the aborted-transaction
    entry the cleaned segment's index keeps for it (an ABORT marker kept with its data).
    Records are only decoded whole when the batch must be rebuilt."""
    stats.batches_read += 1
    stats.bytes_read += h.size
    stats.records_read += h.records_count
    entry: AbortedTxn | None = None
    records: list[Record] | None = None
    if h.is_control:
        records = decode_or_empty(buf, pos, h)
        can_discard, entry = txn.on_control_batch_read(h, records)
        horizon = h.delete_horizon_ms
        discard_records = can_discard and horizon is not None and horizon <= now_ms
    else:
        can_discard = txn.on_batch_read(h)
        discard_records = can_discard
    last = active_producers.get(h.producer_id) if h.producer_id >= 0 else None
    is_last_of_producer = last is not None and (
        h.last_offset == last.last_data_offset if last.last_data_offset is not None
        else h.is_control and h.producer_epoch == last.producer_epoch)
    if discard_records and not is_last_of_producer:
        return None, None
    kept: list[int] = []
    tombstones = False
    if not discard_records and h.records_count:
        if records is not None:  # a marker: never deduplicated
            kept = list(range(len(records)))
        else:
            for i, (offset, key, has_value) in enumerate(record_keys(buf, pos, h)):
                if _retain_record(offset_map, h, offset, key, has_value, now_ms):
                    kept.append(i)
                    tombstones = tombstones or not has_value
    marker_for_empty_txn = can_discard and h.is_control
    if kept:
        stats.batches_written += 1
        stats.records_written += len(kept)
        needs_horizon = (tombstones or marker_for_empty_txn) and h.delete_horizon_ms is None
        if len(kept) == h.records_count and not needs_horizon:
            stats.bytes_written += h.size
            return memoryview(buf)[pos:pos + h.size], entry
        if records is None:
            records = decode_or_empty(buf, pos, h)
        retained = [records[i] for i in kept]
        if needs_horizon:
            base_ts = min(now_ms + delete_retention_ms, INT64_MAX)  # retention may be "forever"
            attrs = h.attributes | ATTR_DELETE_HORIZON
        elif h.delete_horizon_ms is not None:
            base_ts, attrs = h.base_timestamp, h.attributes
        else:
            base_ts, attrs = retained[0].timestamp, h.attributes
        out = rebuild_batch(h, retained, base_ts, attrs)
        stats.bytes_written += len(out)
        return out, entry
    if is_last_of_producer:
        stats.batches_written += 1
        out = empty_batch(h)
        stats.bytes_written += len(out)
        return out, None
    return None, None


def group_segments(segments: list[tuple[int, int, int]], max_bytes: int) -> list[list[int]]:
    """Indexes of consecutive segments to clean into one (Kafka's groupSegmentsBySize): each
    group's total size stays within ``max_bytes`` (segment.bytes) and its offsets within the
    32-bit range a segment's index can hold. ``segments``: (base offset, size, next offset)."""
    groups: list[list[int]] = []
    i = 0
    while i < len(segments):
        group = [i]
        total = segments[i][1]
        base = segments[i][0]
        i += 1
        while i < len(segments) and total + segments[i][1] <= max_bytes \
                and segments[i][2] - 1 - base <= 0x7FFFFFFF:
            total += segments[i][1]
            group.append(i)
            i += 1
        groups.append(group)
    return groups

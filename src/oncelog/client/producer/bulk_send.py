"""The pieces of ``Producer.send_batch`` that are not the producer's state: which rows go to
which partition (column-wise, by the compiled codec of records/columnar.py), and the one future
of the batches of a call."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from ...errors import UnknownTopicOrPartitionError
from ...records.columnar import group_rows, int32_column, partition_for_keys

# (partition, row numbers as int32s or None for rows start..stop in order, start, stop)
RowGroup = tuple[int, bytes | None, int, int]


def route_rows(topic: str, partitions: list[int], partition: Any, keys: Any, rows: int,
               sticky: Any) -> tuple[list[RowGroup], int | None]:
    """The rows of each partition, and the sticky partition the unkeyed rows went to (None if
    none did). ``partition``: None (keyed rows by Kafka's default partitioner, the others to
    the sticky partition ``sticky()`` picks), a partition id for every row, or one per row.
    UnknownTopicOrPartitionError for a partition the topic does not have."""
    if rows == 0:
        return [], None
    if partition is None:
        if keys is None:
            chosen = sticky()
            return [(chosen, None, 0, rows)], chosen
        parts = partition_for_keys(keys, len(partitions))  # an index into ``partitions``
        # A -1 (a null key) is the only int32 here with four 0xff bytes: found by a C scan.
        has_null = b"\xff\xff\xff\xff" in parts
        chosen = sticky() if has_null else None
        order, starts = group_rows(parts, len(partitions),
                                   partitions.index(chosen) if chosen is not None else -1)
        return [(partitions[i], order, starts[i], starts[i + 1])
                for i in range(len(partitions)) if starts[i + 1] > starts[i]], chosen
    if isinstance(partition, int):
        if partition not in partitions:
            raise _unknown(topic, partition, partitions)
        return [(partition, None, 0, rows)], None
    per_row = int32_column(partition, "partition")
    if len(per_row) // 4 != rows:
        raise ValueError(f"partition: {len(per_row) // 4} rows, the values have {rows}")
    span = partitions[-1] + 1
    try:
        order, starts = group_rows(per_row, span)
    except ValueError:
        bad = next(p for p in memoryview(per_row).cast("i") if not 0 <= p < span)
        raise _unknown(topic, bad, partitions) from None
    groups: list[RowGroup] = [(p, order, starts[p], starts[p + 1]) for p in range(span)
                              if starts[p + 1] > starts[p]]
    known = set(partitions)
    for p, *_ in groups:
        if p not in known:
            raise _unknown(topic, p, partitions)
    return groups, None


def _unknown(topic: str, partition: int, partitions: list[int]) -> UnknownTopicOrPartitionError:
    return UnknownTopicOrPartitionError(
        f"partition {partition} of topic {topic!r} does not exist (it has {len(partitions)})")


class BatchGroup:
    """The future of one ``send_batch`` call, which its batches (accumulator.EncodedBatch)
    settle: the list of their (partition, base offset), in order, once every one is
    acknowledged, or the first failure (at once: the others are still sent)."""

    def __init__(self, batches: int) -> None:
        self.future: Future = Future()
        self.future.set_running_or_notify_cancel()
        self._results: list[Any] = [None] * batches
        self._remaining = batches
        self._lock = threading.Lock()
        self._settled = False
        if not batches:
            self.future.set_result([])

    def batch_done(self, index: int, result: tuple[int, int]) -> None:
        with self._lock:
            if self._settled:
                return
            self._results[index] = result
            self._remaining -= 1
            if self._remaining:
                return
            self._settled = True
        self.future.set_result(self._results)

    def batch_failed(self, error: BaseException) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
        self.future.set_exception(error)

"""How many Spark tasks read a batch: the offset ranges of its partitions, split by
``maxRecordsPerPartition`` and ``minPartitions`` as Spark's KafkaOffsetRangeCalculator does
(pure functions: testable without Spark or a broker).

A range's size is its number of offsets, not of records: aborted records, transaction markers
and compacted-away offsets count too (Spark's estimate, the same here).
"""

from __future__ import annotations

import math

# (topic, partition, start, end): [start, end) of one Kafka partition
Range = tuple[str, int, int, int]


def _size(r: Range) -> int:
    return r[3] - r[2]


def _divide(r: Range, parts: int) -> list[Range]:
    """``parts`` consecutive pieces of nearly equal size; the last takes the rounding."""
    t, p, start, end = r
    remaining = end - start
    out = []
    for i in range(parts):
        piece = remaining // (parts - i)
        remaining -= piece
        out.append((t, p, start, min(start + piece, end)))
        start = min(start + piece, end)
    return out


def _part_count(size: int, total: int, min_parts: int) -> int:
    # Java's Math.round: halves round up (Python's round() would round them to even)
    return max(math.floor(size / total * min_parts + 0.5), 1)


def split_ranges(ranges: list[Range], min_partitions: int | None,
                 max_records_per_partition: int | None) -> list[Range]:
    """Empty ranges are dropped. ``maxRecordsPerPartition``: a range of more offsets is cut into
    ceil(size / max) pieces. ``minPartitions``: while there are fewer ranges than that, each
    range gets a share of ``minPartitions`` in proportion to its size (at least one piece);
    ranges whose share is one piece keep it, the others split what is left of
    ``minPartitions`` between them. The number of tasks is therefore about minPartitions, as
    Spark's documentation says: rounding can make it a few more or fewer."""
    out = [r for r in ranges if _size(r) > 0]
    if max_records_per_partition is not None:
        out = [piece for r in out
               for piece in _divide(r, math.ceil(_size(r) / max_records_per_partition))]
    if min_partitions is None or len(out) >= min_partitions:
        return out
    total = sum(_size(r) for r in out)
    unsplit = {i for i, r in enumerate(out) if _part_count(_size(r), total, min_partitions) == 1}
    split_total = total - sum(_size(out[i]) for i in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    result: list[Range] = []
    for i, r in enumerate(out):
        parts = 1 if i in unsplit else _part_count(_size(r), split_total, split_min)
        result.extend(piece for piece in _divide(r, parts) if _size(piece) > 0)
    return result

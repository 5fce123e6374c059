"""Records sections to and from columns, in bulk (issue 19): the compiled codec of
records/_columnar.c behind a Python face.

A v2 batch's records section (what follows its 61-byte header, spec 000 "Message Format") is
encoded here from whole columns of values and keys, and decoded into growing column buffers in
Arrow's layout, without one Python object per record. The bulk produce path
(``Producer.send_batch``) and consume path (``Consumer.poll_columns``) are built on it, and
so is the Spark connector's Arrow reader and writer.

A column (values, keys) is a list of bytes / str / None, or a pyarrow Binary, LargeBinary,
String or LargeString array (sliced arrays and validity bitmaps included; a ChunkedArray is
combined first). pyarrow is optional: it is imported only when an Arrow array is passed or
``RecordColumns.to_arrow`` is called.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from typing import Any

try:
    from ._columnar import binary_list as _binary_list
    from ._columnar import decode as _decode
    from ._columnar import encode as _encode
    from ._columnar import group_rows as _group_rows
    from ._columnar import partition_keys as _partition_keys
except ImportError as exc:  # pragma: no cover  (a checkout whose extension was never built)
    raise ImportError("oncelog's compiled record codec (records/_columnar.c) is not built: "
                      "run scripts/bootstrap.sh (or pip install -e .)") from exc
from .batch import TIMESTAMP_CREATE_TIME, CorruptRecordError

INT64_MIN = -(2**63)
# No limit on a section's size: encode_records makes one section of every row.
_UNLIMITED = sys.maxsize

Headers = Sequence[tuple[str, bytes | None]] | None


def _pyarrow() -> Any:
    try:
        import pyarrow  # optional: only the Arrow paths need it
    except ImportError as exc:
        raise ImportError("Arrow columns need pyarrow: pip install pyarrow") from exc
    return pyarrow


def _is_arrow(obj: Any) -> bool:
    return type(obj).__module__.startswith("pyarrow")


def column_arg(column: Any, what: str) -> list | tuple | None:
    """A values or keys column as the C codec takes it: None (all null), a list, or the Arrow
    layout (validity or None, offsets, data, offset width 4|8, array offset, length)."""
    if column is None or isinstance(column, list):
        return column
    if isinstance(column, tuple) and len(column) == 6:
        return column  # already the Arrow layout (send_batch's columns reach the partitioner so)
    if not _is_arrow(column):
        if isinstance(column, (str, bytes)):
            raise TypeError(f"{what}: a column (list or Arrow array), not a single {what[:-1]}")
        return list(column)
    pa = _pyarrow()
    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    t = column.type
    if pa.types.is_null(t):
        return [None] * len(column)
    if pa.types.is_binary(t) or pa.types.is_string(t):
        wide = 4
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        wide = 8
    elif pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t) \
            or pa.types.is_string_view(t):
        column = column.cast(pa.large_binary())  # other layouts: one copy into this one
        wide = 8
    else:
        raise TypeError(f"{what}: an Arrow binary or string array, not {t}")
    validity, offsets, data = column.buffers()[:3]
    return (validity if column.null_count else None, offsets, data, wide, column.offset,
            len(column))


def headers_arg(headers: Any, what: str = "headers") -> list | tuple | None:
    """Per-row headers as the C codec takes them: None, a list (per row None or a sequence
    of (str, bytes | None) pairs), or the Arrow layout of a pyarrow list<struct<key: string,
    value: binary>> array (Spark's Kafka ``headers`` column), encoded without a Python object
    per header."""
    if headers is None or isinstance(headers, list):
        return headers
    if not _is_arrow(headers):
        return list(headers)
    pa = _pyarrow()
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.chunk(0) if headers.num_chunks == 1 else headers.combine_chunks()
    t = headers.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) \
            or not pa.types.is_struct(t.value_type) \
            or t.value_type.get_field_index("key") < 0 \
            or t.value_type.get_field_index("value") < 0:
        raise TypeError(f"{what}: a list<struct<key: string, value: binary>> array, not {t}")
    entries = headers.values  # every row's entries, whatever slice of them ``headers`` is
    fields = entries.flatten()  # (the entries' own offset and nulls applied)
    keys = fields[t.value_type.get_field_index("key")]
    values = fields[t.value_type.get_field_index("value")]
    validity, offsets = headers.buffers()[:2]
    return ("arrow", validity if headers.null_count else None, offsets,
            8 if pa.types.is_large_list(t) else 4, headers.offset, len(headers),
            _entry_column(keys, "header keys"), _entry_column(values, "header values"))


def _entry_column(column: Any, what: str) -> tuple | list:
    arg = column_arg(column, what)
    if arg is None:
        return [None] * len(column)
    return arg


def int64_column(values: Any, n: int, what: str) -> bytes | memoryview | None:
    """Per-row int64s (timestamps in ms) as a buffer of ``n`` native int64s; None stays None."""
    if values is None:
        return None
    if _is_arrow(values):
        pa = _pyarrow()
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.null_count:
            raise ValueError(f"{what}: nulls are not allowed")
        if pa.types.is_timestamp(values.type) or pa.types.is_date(values.type):
            values = values.cast(pa.int64()) if values.type == pa.timestamp("ms") \
                else values.cast(pa.timestamp("ms")).cast(pa.int64())
        values = values.cast(pa.int64())
        buf = memoryview(values.buffers()[1])[values.offset * 8 : (values.offset + n) * 8]
        out: bytes | memoryview = buf
    else:
        out = array("q", values).tobytes()
    if len(out) != 8 * n:
        raise ValueError(f"{what}: {len(out) // 8} rows, the values have {n}")
    return out


def int32_column(values: Any, what: str) -> bytes | memoryview:
    """Per-row int32s (partitions, row indices) as a buffer of native int32s."""
    if isinstance(values, (bytes, memoryview, array)):
        return values if not isinstance(values, array) else values.tobytes()
    if _is_arrow(values):
        pa = _pyarrow()
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        if values.null_count:
            raise ValueError(f"{what}: nulls are not allowed")
        values = values.cast(pa.int32())
        n = len(values)
        return memoryview(values.buffers()[1])[values.offset * 4 : (values.offset + n) * 4]
    try:
        return array("i", values).tobytes()
    except OverflowError:
        raise ValueError(f"{what}: a value outside int32") from None


def encode_sections(values: Any, keys: Any = None, *, timestamps: Any = None,
                    default_timestamp: int = 0, headers: list | tuple | None = None,
                    indices: Any = None, start: int = 0, stop: int | None = None,
                    max_bytes: int = _UNLIMITED) -> tuple[list[tuple[bytes, int, int, int]], int]:
    """Rows ``indices[start:stop]`` (row numbers ``start:stop`` without ``indices``) encoded as
    records sections of at most ``max_bytes`` bytes each, in order: a list of (section, record
    count, base timestamp, max timestamp), and the largest single record's size. A record
    larger than ``max_bytes`` gets a section of its own (Kafka gives it a batch of its own).

    Columns are already converted (``column_arg``, ``headers_arg``, ``int64_column``,
    ``int32_column``); rows
    without ``timestamps`` get ``default_timestamp``. Offset deltas run 0..count-1 per
    section, timestamp deltas from its first record, record attributes 0."""
    if stop is None:
        stop = len(indices) // 4 if indices is not None else column_rows(values)
    return _encode(values, keys, headers, timestamps, default_timestamp, indices, start, stop,
                   max_bytes)


def column_rows(column: list | tuple | None) -> int:
    """The rows of a column as ``column_arg`` returns it (0 for None)."""
    if column is None:
        return 0
    return len(column) if isinstance(column, list) else int(column[5])


def encode_records(values: Any, keys: Any = None, timestamps: Any = None,
                   headers: Any = None, indices: Any = None) -> bytes:
    """One records section of every row (or of rows ``indices``, an int32 buffer or a
    sequence of ints, in that order): what ``records.batch.build_batch`` puts after the batch
    header, built from columns. ``timestamps``: one int for every row, or per row (a
    sequence or Arrow int64/timestamp array; default: 0). ``headers``: per row None or a
    sequence of (str, bytes | None) pairs, or a pyarrow list<struct<key: string, value:
    binary>> array."""
    vals = column_arg(values, "values")
    n = column_rows(vals)
    default = 0
    ts = None
    if isinstance(timestamps, int):
        default = timestamps
    else:
        ts = int64_column(timestamps, n, "timestamps")
    idx = None if indices is None else int32_column(indices, "indices")
    chunks, _largest = encode_sections(vals, column_arg(keys, "keys"), timestamps=ts,
                                       default_timestamp=default, headers=headers_arg(headers),
                                       indices=idx)
    return chunks[0][0] if chunks else b""


def partition_for_keys(keys: Any, num_partitions: int) -> bytes:
    """Kafka's default partitioner (``toPositive(murmur2(key)) % num_partitions``, as
    client/producer/partitioner.py) for a column of keys: native int32s, -1 where the key is null."""
    return _partition_keys(column_arg(keys, "keys"), num_partitions)


def group_rows(partitions: bytes | memoryview, num_partitions: int, null_partition: int = -1
               ) -> tuple[bytes, memoryview]:
    """Row numbers grouped by partition, stably: (int32 row numbers, int64 starts) where the
    rows of partition p are ``rows[starts[p]:starts[p + 1]]``. A -1 goes to
    ``null_partition``. ValueError names the first row whose partition is outside
    0..num_partitions-1."""
    rows, starts = _group_rows(partitions, num_partitions, null_partition)
    return rows, memoryview(starts).cast("q")


# --- decoding -------------------------------------------------------------------------------

# The growing buffers, in _columnar.c's order (B_*), and its counters (C_*).
_OFFSET, _TIMESTAMP, _TS_TYPE, _KEY_VALID, _KEY_OFFS, _KEY_DATA, _VAL_VALID, _VAL_OFFS, \
    _VAL_DATA, _HDR_VALID, _HDR_OFFS, _HK_OFFS, _HK_DATA, _HV_VALID, _HV_OFFS, _HV_DATA = range(16)
_N_BUFFERS = 16
_OFFSET_BUFFERS = (_KEY_OFFS, _VAL_OFFS, _HDR_OFFS, _HK_OFFS, _HV_OFFS)
_ROWS, _KEY_NULLS, _KEY_BYTES, _VAL_NULLS, _VAL_BYTES, _HDR_NULLS, _HEADERS, _HK_BYTES, \
    _HV_NULLS, _HV_BYTES = range(10)
_N_COUNTERS = 10


class RecordColumns:
    """Decoded records of one partition, column by column, appended batch after batch.

    Buffers grow geometrically (appending a partition's many batches costs linear time);
    ``to_arrow`` wraps them without copying. Columns: offset (int64), timestamp (int64 ms),
    timestamp_type (int32: 0 CreateTime, 1 LogAppendTime), key and value (binary), headers
    (list<struct<key: string, value: binary>>, null for a record without headers, as Spark's
    Kafka source shows them).
    """

    __slots__ = ("_buffers", "_counters", "_exported", "partition", "topic")

    def __init__(self, topic: str | None = None, partition: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self._buffers = [bytearray(4) if k in _OFFSET_BUFFERS else bytearray()
                         for k in range(_N_BUFFERS)]
        self._counters = bytearray(8 * _N_COUNTERS)
        self._exported = False

    def __repr__(self) -> str:
        return f"<RecordColumns {self.topic}-{self.partition} count={self.count}>"

    def __len__(self) -> int:
        return self.count

    @property
    def count(self) -> int:
        """Records appended so far."""
        return self._counter(_ROWS)

    def _counter(self, k: int) -> int:
        return int.from_bytes(self._counters[8 * k : 8 * k + 8], sys.byteorder, signed=True)

    def append_records(self, data: Any, count: int, base_offset: int, base_timestamp: int, *,
                       log_append_time: int | None = None,
                       timestamp_type: int = TIMESTAMP_CREATE_TIME,
                       min_offset: int = INT64_MIN) -> int:
        """Append the ``count`` records of one uncompressed records section ``data`` (any
        buffer), those at offset ``min_offset`` or above; return how many were appended.
        ``log_append_time``: the batch's maxTimestamp when it is LogAppendTime (every record
        then shows it). CorruptRecordError if the records do not fill ``data`` exactly as
        Kafka lays them out; nothing is appended then."""
        if self._exported:
            # Arrow arrays share the buffers (a bytearray cannot grow while exported): the
            # next records go to copies, the arrays keep the old ones.
            self._buffers = [bytearray(b) for b in self._buffers]
            self._exported = False
        try:
            return _decode(data, count, base_offset, base_timestamp,
                           log_append_time is not None,
                           log_append_time if log_append_time is not None else 0,
                           timestamp_type, min_offset, self._buffers, self._counters)
        except ValueError as exc:
            raise CorruptRecordError(str(exc)) from None

    # --- reading the columns ----------------------------------------------------------------

    def offsets(self) -> memoryview:
        """The offset column as a memoryview of int64s (no copy)."""
        return memoryview(self._buffers[_OFFSET])[: 8 * self.count].cast("q")

    def timestamps(self) -> memoryview:
        return memoryview(self._buffers[_TIMESTAMP])[: 8 * self.count].cast("q")

    def timestamp_types(self) -> memoryview:
        return memoryview(self._buffers[_TS_TYPE])[: 4 * self.count].cast("i")

    def _binary(self, valid: int, offs: int, data: int, nulls: int, n: int
                ) -> list[bytes | None]:
        """A binary column as Python objects (ConsumerRecords need them)."""
        b = self._buffers
        return _binary_list(b[valid] if nulls else None, b[offs], b[data], 0, n)

    def keys(self) -> list[bytes | None]:
        return self._binary(_KEY_VALID, _KEY_OFFS, _KEY_DATA, self._counter(_KEY_NULLS),
                            self.count)

    def values(self) -> list[bytes | None]:
        return self._binary(_VAL_VALID, _VAL_OFFS, _VAL_DATA, self._counter(_VAL_NULLS),
                            self.count)

    def headers(self) -> list[list[tuple[str, bytes | None]]]:
        """Each record's headers as (key, value) pairs (an empty list for none)."""
        n = self.count
        if self._counter(_HEADERS) == 0:
            return [[] for _ in range(n)]
        lists = memoryview(self._buffers[_HDR_OFFS])[: 4 * (n + 1)].cast("i").tolist()
        total = self._counter(_HEADERS)
        hk = memoryview(self._buffers[_HK_OFFS])[: 4 * (total + 1)].cast("i").tolist()
        kd = self._buffers[_HK_DATA]
        hv = self._binary(_HV_VALID, _HV_OFFS, _HV_DATA, self._counter(_HV_NULLS), total)
        keys = [kd[hk[j] : hk[j + 1]].decode() for j in range(total)]
        return [list(zip(keys[lists[i] : lists[i + 1]], hv[lists[i] : lists[i + 1]],
                         strict=True)) for i in range(n)]

    def to_arrow(self) -> dict[str, Any]:
        """The columns as pyarrow arrays sharing this object's memory (no copy): offset,
        timestamp, timestamp_type, key, value, headers. Appending afterwards leaves the
        arrays as they are."""
        pa = _pyarrow()
        n = self.count
        b = self._buffers
        self._exported = True

        def buf(k: int, size: int) -> Any:
            return pa.py_buffer(b[k]).slice(0, size)

        def validity(k: int, nulls: int, rows: int) -> Any:
            return buf(k, (rows + 7) // 8) if nulls else None

        def binary(kind: Any, valid: int | None, offs: int, data: int, nulls: int,
                   rows: int) -> Any:
            size = int.from_bytes(b[offs][4 * rows : 4 * rows + 4], sys.byteorder)
            bits = None if valid is None else validity(valid, nulls, rows)
            return pa.Array.from_buffers(
                kind, rows, [bits, buf(offs, 4 * (rows + 1)), buf(data, size)],
                null_count=nulls)

        total = self._counter(_HEADERS)
        header_type = pa.struct([("key", pa.string()), ("value", pa.binary())])
        entries = pa.Array.from_buffers(header_type, total, [None], children=[
            binary(pa.string(), None, _HK_OFFS, _HK_DATA, 0, total),  # keys are never null
            binary(pa.binary(), _HV_VALID, _HV_OFFS, _HV_DATA, self._counter(_HV_NULLS),
                   total)])
        hdr_nulls = self._counter(_HDR_NULLS)
        return {
            "offset": pa.Array.from_buffers(pa.int64(), n, [None, buf(_OFFSET, 8 * n)]),
            "timestamp": pa.Array.from_buffers(pa.int64(), n, [None, buf(_TIMESTAMP, 8 * n)]),
            "timestamp_type": pa.Array.from_buffers(pa.int32(), n,
                                                    [None, buf(_TS_TYPE, 4 * n)]),
            "key": binary(pa.binary(), _KEY_VALID, _KEY_OFFS, _KEY_DATA,
                          self._counter(_KEY_NULLS), n),
            "value": binary(pa.binary(), _VAL_VALID, _VAL_OFFS, _VAL_DATA,
                            self._counter(_VAL_NULLS), n),
            "headers": pa.Array.from_buffers(
                pa.list_(header_type), n,
                [validity(_HDR_VALID, hdr_nulls, n), buf(_HDR_OFFS, 4 * (n + 1))],
                null_count=hdr_nulls, children=[entries]),
        }

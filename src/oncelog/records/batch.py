"""The v2 ("magic 2") record batch, exactly as Kafka lays it out on the wire and on disk.

spec 000, "Message Format". Layout (big-endian)::

    baseOffset           int64    0
    batchLength          int32    8   bytes after this field
    partitionLeaderEpoch int32   12
    magic                int8    16   = 2
    crc                  uint32  17   CRC32C over attributes .. end of batch
    attributes           int16   21   bits 0-2 compression, 3 timestamp type,
                                       4 transactional, 5 control
    lastOffsetDelta      int32   23
    baseTimestamp        int64   27
    maxTimestamp         int64   35
    producerId           int64   43
    producerEpoch        int16   51
    baseSequence         int32   53
    recordsCount         int32   57
    records                      61

Pure functions on bytes; nothing here does IO.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from crc32c import crc32c
from kio.schema.errors import ErrorCode

try:
    from ._recordwalk import scan_records
except ImportError as exc:  # pragma: no cover  (a checkout whose extension was never built)
    raise ImportError("oncelog's compiled record walk (records/_recordwalk.c) is not built: "
                      "run scripts/bootstrap.sh (or pip install -e .)") from exc
from .. import primitives
from ..primitives import DecodeError
from .compression import (
    Compression,
    CompressionError,
    decompress,
    inflate_limit,
    inflate_prefix,
    lz4_frame_problem,
    produce_inflate_limit,
)
from .compression import compress as _compress

MAGIC = 2
HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: what batchLength does not count
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
PARTITION_LEADER_EPOCH_OFFSET = 12
RECORDS_COUNT_OFFSET = 57

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
INT32_MAX = 0x7FFFFFFF
INT64_MAX = 2**63 - 1

NO_TIMESTAMP = -1
TIMESTAMP_CREATE_TIME = 0
TIMESTAMP_LOG_APPEND_TIME = 1

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
# KIP-534: the log cleaner stamped this batch's delete horizon into its baseTimestamp.
ATTR_DELETE_HORIZON = 0x40

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_LENGTH = struct.Struct(">qi")
_Q = struct.Struct(">q")
_i = struct.Struct(">i")
_I = struct.Struct(">I")
_H = struct.Struct(">h")


class CorruptRecordError(ValueError):
    """A batch failed validation: bad CRC, bad magic, unknown codec, truncated, a payload that
    does not decompress (Kafka's CORRUPT_MESSAGE)."""

    error_name = ErrorCode.corrupt_message


class UnreadableFrameError(CorruptRecordError):
    """A compressed payload whose frame Kafka's reader refuses outright (LZ4 of linked blocks):
    its KafkaException is no CorruptRecordException, and Kafka's broker answers the produce
    with UNKNOWN_SERVER_ERROR (measured on Kafka 4.3), which a client does not retry."""

    error_name = ErrorCode.unknown_server_error


class InvalidRecordError(CorruptRecordError):
    """A batch whose frame is intact but whose records are not what its header says: a record
    count or offset range that does not match the records, malformed records, trailing bytes
    (Kafka's InvalidRecordException: INVALID_RECORD)."""

    error_name = ErrorCode.invalid_record


class BatchHeader(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies, log overhead included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & ATTR_COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> int:
        return 1 if self.attributes & ATTR_TIMESTAMP_TYPE else 0

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534: when the cleaner may remove this batch's tombstones (or its marker), once
        a first cleaning pass has stamped it; None before."""
        return self.base_timestamp if self.attributes & ATTR_DELETE_HORIZON else None

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def increment_sequence(sequence: int, increment: int) -> int:
    """Sequences wrap at int32 max back to 0 (spec 000, "PID-Sequence Management")."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def parse_header(buf, pos: int = 0) -> BatchHeader:
    """Parse the fixed 61-byte header at ``pos``. Raises CorruptRecordError if short."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(f"batch header truncated: {len(buf) - pos} bytes")
    return BatchHeader._make(_HEADER.unpack_from(buf, pos))


def batch_crc(buf, pos: int, size: int) -> int:
    """CRC32C of attributes .. end of the batch at ``pos`` spanning ``size`` bytes."""
    return crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size])


def validate_batch(buf, pos: int = 0, *, cleaned: bool = False) -> BatchHeader:
    """Check one batch's framing, magic and CRC; return its header.

    Cheap on the record data: only the CRC touches every byte. The record count is
    checked against lastOffsetDelta (Kafka's broker rule for a producer's v2 batches). With
    ``cleaned`` (a batch already in a log: recovery, a follower's fetch) the log cleaner may
    have removed records and kept the offset range (records/batch.py ``rebuild_batch``), so
    the count may be anything from 0 to lastOffsetDelta + 1.
    """
    header = parse_header(buf, pos)
    if header.magic != MAGIC:
        raise CorruptRecordError(f"unsupported magic {header.magic} (only v2 batches)")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(f"batch length {header.batch_length} below header size")
    if len(buf) - pos < header.size:
        raise CorruptRecordError(
            f"batch truncated: needs {header.size} bytes, has {len(buf) - pos}"
        )
    if batch_crc(buf, pos, header.size) != header.crc:
        raise CorruptRecordError("batch CRC32C mismatch")
    if header.attributes & ATTR_COMPRESSION_MASK > Compression.ZSTD:
        raise CorruptRecordError(
            f"unknown compression codec {header.attributes & ATTR_COMPRESSION_MASK}")
    if cleaned:
        if not 0 <= header.records_count <= header.last_offset_delta + 1:
            raise InvalidRecordError(
                f"record count {header.records_count} outside [0, lastOffsetDelta + 1 = "
                f"{header.last_offset_delta + 1}]")
    elif header.records_count <= 0 or header.records_count != header.last_offset_delta + 1:
        # Kafka's LogValidator.validateBatch: "Inconsistent batch offset range".
        raise InvalidRecordError(
            f"record count {header.records_count} does not match "
            f"lastOffsetDelta {header.last_offset_delta}"
        )
    return header


def iter_batches(buf, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch; stop at a partial trailing batch.

    Fetch responses may end in a partial batch (Kafka truncates at the size limit); readers
    ignore it, as Kafka's clients do.
    """
    if end is None:
        end = len(buf)
    while end - pos >= HEADER_SIZE:
        header = parse_header(buf, pos)
        size = header.size
        if size < HEADER_SIZE or pos + size > end:
            return
        yield pos, header
        pos += size


def split_batches(buf) -> list[tuple[int, BatchHeader]]:
    """Validate a produce request's record set: every byte must belong to a valid batch."""
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    n = len(buf)
    while pos < n:
        header = validate_batch(buf, pos)
        out.append((pos, header))
        pos += header.size
    if not out:
        raise CorruptRecordError("empty record set")
    return out


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Rewrite the base offset in place. The CRC does not cover it, so nothing else changes."""
    _Q.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Stamp the leader's epoch into the batch at ``pos`` in place (what a partition leader does
    to every batch it appends). Outside the CRC, like the base offset."""
    _i.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, size: int, timestamp: int) -> None:
    """Stamp a batch with LogAppendTime: set the timestamp-type bit and maxTimestamp, redo CRC."""
    (attrs,) = _H.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _H.pack_into(buf, pos + ATTRIBUTES_OFFSET, attrs | ATTR_TIMESTAMP_TYPE)
    _Q.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    _I.pack_into(buf, pos + CRC_OFFSET, batch_crc(buf, pos, size))


def set_max_timestamp(buf: bytearray | memoryview, pos: int, size: int, timestamp: int) -> None:
    """Rewrite a CreateTime batch's maxTimestamp in place and redo its CRC (Kafka's
    DefaultRecordBatch.setMaxTimestamp)."""
    _Q.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp)
    _I.pack_into(buf, pos + CRC_OFFSET, batch_crc(buf, pos, size))


# --- varints: Kafka's zig-zag varints, from oncelog/primitives.py ----------------------------
# ``decode_varint`` raises primitives.DecodeError; the record readers below turn it into
# CorruptRecordError where they catch it, rather than each varint paying for a wrapper call.

encode_varint = primitives.encode_varint
decode_varint = primitives.read_varint


# --- records --------------------------------------------------------------------------------


@dataclass(slots=True)
class Record:
    """One record as a consumer sees it: absolute offset and timestamp resolved."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


def _encode_bytes(data: bytes | None) -> bytes:
    if data is None:
        return encode_varint(-1)
    return encode_varint(len(data)) + data


def encode_record(
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] = (),
) -> bytes:
    body = bytearray(b"\x00")  # record attributes: unused
    body += encode_varint(timestamp_delta)
    body += encode_varint(offset_delta)
    body += _encode_bytes(key)
    body += _encode_bytes(value)
    body += encode_varint(len(headers))
    for hkey, hvalue in headers:
        body += _encode_bytes(hkey.encode())
        body += _encode_bytes(hvalue)
    return encode_varint(len(body)) + bytes(body)


def _read_bytes(buf, pos: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(buf, pos)
    if length < 0:
        return None, pos
    end = pos + length
    if end > len(buf):
        raise CorruptRecordError("record field overruns record")
    return bytes(buf[pos:end]), end


def decode_record_set(data, count: int, base_offset: int, base_timestamp: int,
                      log_append_time: int | None = None) -> list[Record]:
    """Decode ``count`` varint-framed records from (decompressed) ``data``."""
    try:
        return _decode_record_set(data, count, base_offset, base_timestamp, log_append_time)
    except DecodeError as exc:  # a varint truncated or too long
        raise CorruptRecordError(str(exc)) from None


def _decode_record_set(data, count: int, base_offset: int, base_timestamp: int,
                       log_append_time: int | None) -> list[Record]:
    out: list[Record] = []
    pos = 0
    n = len(data)
    for _ in range(count):
        length, pos = decode_varint(data, pos)
        end = pos + length
        if length < 0 or end > n:
            raise CorruptRecordError("record length overruns batch")
        pos += 1  # attributes
        ts_delta, pos = decode_varint(data, pos)
        off_delta, pos = decode_varint(data, pos)
        key, pos = _read_bytes(data, pos)
        value, pos = _read_bytes(data, pos)
        nheaders, pos = decode_varint(data, pos)
        if nheaders < 0:
            raise CorruptRecordError("negative header count")
        headers: list[tuple[str, bytes | None]] = []
        for _h in range(nheaders):
            hk, pos = _read_bytes(data, pos)
            hv, pos = _read_bytes(data, pos)
            if hk is None:
                raise CorruptRecordError("null header key")
            headers.append((hk.decode("utf-8", "replace"), hv))
        if pos != end:
            raise CorruptRecordError("record length does not match its fields")
        ts = log_append_time if log_append_time is not None else base_timestamp + ts_delta
        out.append(Record(base_offset + off_delta, ts, key, value, headers))
    if pos != n:
        raise CorruptRecordError("trailing bytes after the last record")
    return out


def batch_payload(buf, pos: int, header: BatchHeader, limit: int = 0) -> bytes | memoryview:
    """The records of the batch at ``pos``, decompressed: at most ``limit`` bytes (default:
    ``inflate_limit`` of the batch's own size), CorruptRecordError otherwise (issue 16,
    decompression bombs)."""
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    codec = header.attributes & ATTR_COMPRESSION_MASK
    if not codec:
        return body
    try:
        return decompress(codec, body, limit or inflate_limit(header.size))
    except CompressionError as exc:
        raise CorruptRecordError(str(exc)) from None


def decode_batch(buf, pos: int = 0, verify_crc: bool = True, *, limit: int = 0
                 ) -> tuple[BatchHeader, list[Record]]:
    """Decode one complete batch at ``pos``: header plus its records, decompressed (at most
    ``limit`` bytes of them: see ``batch_payload``)."""
    # A stored batch, which a log cleaner may have rebuilt with fewer records.
    header = validate_batch(buf, pos, cleaned=True) if verify_crc else parse_header(buf, pos)
    data = batch_payload(buf, pos, header, limit)
    lat = header.max_timestamp if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME else None
    records = decode_record_set(data, header.records_count, header.base_offset,
                                header.base_timestamp, lat)
    return header, records


def record_keys(buf, pos: int, header: BatchHeader) -> list[tuple[int, bytes | None, bool]]:
    """(offset, key, whether it has a value) of every record of the batch at ``pos``, the
    rest of each record skipped: what the log cleaner decides on. CorruptRecordError as
    ``decode_batch``."""
    data = batch_payload(buf, pos, header)
    out: list[tuple[int, bytes | None, bool]] = []
    p = 0
    n = len(data)
    try:
        for _ in range(header.records_count):
            length, start = decode_varint(data, p)
            end = start + length
            if length < 0 or end > n:
                raise CorruptRecordError("record length overruns batch")
            _ts, q = decode_varint(data, start + 1)  # after the attributes byte
            delta, q = decode_varint(data, q)
            key, q = _read_bytes(data, q)
            value_length, _q = decode_varint(data, q)
            out.append((header.base_offset + delta, key, value_length >= 0))
            p = end
    except DecodeError as exc:
        raise CorruptRecordError(str(exc)) from None
    return out


def check_records(buf, pos: int, header: BatchHeader, limit: int = 0, *,
                  give_up_past: int = 0) -> tuple[int, int] | None:
    """Validate the records inside a batch whose frame ``validate_batch`` accepted, as Kafka's
    LogValidator and DefaultRecord.readFrom do, and return the (smallest, largest) record
    timestamp. Kafka's checks: the payload decompresses (within ``limit``, by default
    records/compression.py's ``produce_inflate_limit``) and holds exactly ``recordsCount``
    records, no more bytes; each record's length covers exactly its fields; offset deltas run
    0..count-1 (we store batches as sent, so we refuse what Kafka would rewrite); header keys
    are not null. The batch's maxTimestamp is not checked here: the leader rewrites it from
    the records (log/validator.py), as Kafka's LogValidator does.

    A compressed payload is read as Kafka's streaming iterator reads it, stopping at the first
    bad record: see ``_inflate_checked``. ``give_up_past``: if the payload inflates past this
    many bytes (its first records being good), return None instead of reading on (the caller
    reads it whole elsewhere: off the event loop).

    One pass over the varints, no record objects: this runs on every produced batch.
    CorruptRecordError (undecompressable) or InvalidRecordError (the records are wrong).
    """
    count = header.records_count
    codec = header.attributes & ATTR_COMPRESSION_MASK
    body = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    data: bytes | bytearray | memoryview | None = body
    if codec:
        if codec == Compression.LZ4:  # Kafka's reader takes independent blocks only
            problem = lz4_frame_problem(body)
            if problem:
                raise UnreadableFrameError(problem)
        data = _inflate_checked(codec, body, count, limit or produce_inflate_limit(header.size),
                                give_up_past)
        if data is None:
            return None
    lo, hi = _scan_records(data, count)
    base = header.base_timestamp
    return base + lo, base + hi


# A compressed batch's records are read in windows: the first PROBE_BYTES of the payload, then
# PROBE_GROWTH times more each time, up to the limit, the records of each window checked before
# the next is inflated. A bomb is refused at its first bad record, having cost a window at most
# PROBE_GROWTH times the good bytes before it (at least PROBE_BYTES), not the whole limit; a
# good batch that fits the first window (every batch of the Java client's default batch.size,
# 16 KiB, and of librdkafka's, 1,000,000 bytes) is inflated once, a larger one at most
# 1 + 1/(PROBE_GROWTH - 1) times.
PROBE_BYTES = 1 << 20
PROBE_GROWTH = 8
# length, attributes, timestamp delta, offset delta, key length, value length, header count
MIN_RECORD_BYTES = 7


def _inflate_checked(codec: int, body, count: int, limit: int, give_up_past: int
                     ) -> bytes | bytearray | None:
    """The payload inflated (at most ``limit`` bytes), its records checked window by window
    on the way (``_check_prefix``); None once it is past ``give_up_past`` (when set)."""
    if count * MIN_RECORD_BYTES > limit:
        raise CorruptRecordError(f"{count} records cannot fit in the {limit} bytes a batch may "
                                 "inflate to")
    window = min(PROBE_BYTES, limit)
    while True:
        try:
            data, more = inflate_prefix(codec, body, window)
        except CompressionError as exc:
            raise CorruptRecordError(str(exc)) from None
        if not more:
            return data
        if window >= limit:
            raise CorruptRecordError(f"{Compression(codec).name}: payload inflates past the "
                                     f"limit of {limit} bytes")
        if data:
            _check_prefix(data, count, limit)
        if give_up_past and window >= give_up_past:
            return None
        window = min(window * PROBE_GROWTH, limit)


_TRUNCATED = re.compile(r"record \d+ overruns the batch$")
_LONG = re.compile(r"record \d+: length (-?\d+) does not fit")


def _check_prefix(data, count: int, limit: int) -> None:
    """The records wholly inside ``data``, the first bytes of a longer payload: refuse the
    first bad one (InvalidRecordError); a record cut off by the window's end is read in the
    next window, unless it claims more than ``limit`` bytes (CorruptRecordError, as a payload
    inflating past the limit)."""
    try:
        scan_records(data, count)
    except ValueError as exc:
        message = str(exc)
        if _TRUNCATED.match(message):
            return
        m = _LONG.match(message)
        if m and 6 <= int(m[1]) <= limit:
            return
        if m and int(m[1]) > limit:  # the payload would inflate past the limit
            raise CorruptRecordError(f"{message.split(' does not fit')[0]} is past the limit of "
                                     f"{limit} bytes a batch may inflate to") from None
        raise InvalidRecordError(message) from None


def find_timestamp(buf, pos: int, header: BatchHeader, timestamp: int
                   ) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch's first record whose timestamp is >= ``timestamp``, or
    None: ListOffsets by timestamp. Walks the varints without making record objects (a bounded
    payload may still hold millions of records); CorruptRecordError as ``batch_payload``."""
    if header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        if header.max_timestamp >= timestamp:
            return header.base_offset, header.max_timestamp
        return None
    data = batch_payload(buf, pos, header)
    base = header.base_timestamp
    p = 0
    try:
        for _ in range(header.records_count):
            length, start = decode_varint(data, p)
            ts, q = decode_varint(data, start + 1)  # after the attributes byte
            if base + ts >= timestamp:
                od, q = decode_varint(data, q)
                return header.base_offset + od, base + ts
            p = start + length
    except DecodeError as exc:
        raise CorruptRecordError(str(exc)) from None
    return None


def _scan_records(data, count: int) -> tuple[int, int]:
    """(smallest, largest) timestamp delta of ``count`` records filling ``data`` exactly, by
    the C walk (records/_recordwalk.c): this is the produce path's per-record cost."""
    try:
        return scan_records(data, count)
    except ValueError as exc:
        raise InvalidRecordError(str(exc)) from None


def _scan_records_py(data, count: int) -> tuple[int, int]:
    """The same walk in Python: the reference the C walk is tested against (tests/test_records.py),
    with hand-inlined single-byte varint fast paths."""
    n = len(data)
    pos = 0
    lo, hi = INT64_MAX, -INT64_MAX
    dv = decode_varint
    i = 0
    try:
        for i in range(count):
            b = data[pos]
            if b < 0x80:
                end = pos + 1 + ((b >> 1) ^ -(b & 1))
                pos += 1
            elif data[pos + 1] < 0x80:  # two bytes: records of 64 B to 8 KiB
                b = (b & 0x7F) | (data[pos + 1] << 7)
                end = pos + 2 + ((b >> 1) ^ -(b & 1))
                pos += 2
            else:
                length, pos = dv(data, pos)
                end = pos + length
            # attributes, timestamp delta, offset delta, key length, value length, header count
            if end > n or end - pos < 6:
                raise InvalidRecordError(
                    f"record {i}: length {end - pos} does not fit the batch's {n - pos} bytes "
                    "left")
            b = data[pos + 1]
            if b < 0x80:
                ts = (b >> 1) ^ -(b & 1)
                pos += 2
            elif data[pos + 2] < 0x80:
                ts = (b & 0x7F) | (data[pos + 2] << 7)
                ts = (ts >> 1) ^ -(ts & 1)
                pos += 3
            else:
                ts, pos = dv(data, pos + 1)
            if ts < lo:  # noqa: PLR1730 (no min()/max() calls in this loop: hot path)
                lo = ts
            if ts > hi:  # noqa: PLR1730
                hi = ts
            b = data[pos]
            i2 = i << 1  # the offset delta, zig-zag encoded
            if b == i2 and b < 0x80:  # i < 64: one byte
                pos += 1
            elif b == (i2 & 0x7F) | 0x80 and data[pos + 1] == i2 >> 7:  # i < 8192
                pos += 2
            else:
                od, pos = dv(data, pos)
                if od != i:
                    raise InvalidRecordError(f"record {i} has offset delta {od}")
            b = data[pos]  # key length: -1 (null) or the bytes that follow
            if b < 0x80 and not b & 1:
                pos += 1 + (b >> 1)
            elif b == 1:
                pos += 1
            elif not b & 1 and data[pos + 1] < 0x80:
                pos += 2 + (((b & 0x7F) | (data[pos + 1] << 7)) >> 1)
            else:
                ln, pos = dv(data, pos)
                if ln < -1:
                    raise InvalidRecordError(f"record {i}: key length {ln}")
                pos += max(ln, 0)
            b = data[pos]  # value length: -1 (null) or the bytes that follow
            if b < 0x80 and not b & 1:
                pos += 1 + (b >> 1)
            elif b == 1:
                pos += 1
            elif not b & 1 and data[pos + 1] < 0x80:
                pos += 2 + (((b & 0x7F) | (data[pos + 1] << 7)) >> 1)
            else:
                ln, pos = dv(data, pos)
                if ln < -1:
                    raise InvalidRecordError(f"record {i}: value length {ln}")
                pos += max(ln, 0)
            if data[pos] == 0:  # no headers: the common case
                pos += 1
            else:
                pos = _scan_headers(data, pos, i)
            if pos != end:
                raise InvalidRecordError(f"record {i}: its length does not match its fields")
    except IndexError:
        raise InvalidRecordError(f"record {i} overruns the batch") from None
    except InvalidRecordError:
        raise
    except DecodeError as exc:  # a varint decode_varint refused
        raise InvalidRecordError(f"record {i}: {exc}") from None
    if pos != n:
        raise InvalidRecordError(
            f"{n - pos} bytes after the last of the header's {count} records")
    return lo, hi


def _scan_headers(data, pos: int, i: int) -> int:
    nheaders, pos = decode_varint(data, pos)
    if nheaders < 0:
        raise InvalidRecordError(f"record {i}: {nheaders} headers")
    for _ in range(nheaders):
        ln, pos = decode_varint(data, pos)
        if ln < 0:
            raise InvalidRecordError(f"record {i}: a header key is null")
        pos += ln
        ln, pos = decode_varint(data, pos)
        if ln < -1:
            raise InvalidRecordError(f"record {i}: header value length {ln}")
        pos += max(ln, 0)
        if pos > len(data):
            raise IndexError
    return pos


def build_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]],
    *,
    base_offset: int = 0,
    compression: Compression | int = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = TIMESTAMP_CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """Encode a batch from (key, value, headers, timestamp_ms) tuples."""
    if not records:
        raise ValueError("a batch needs at least one record")
    base_ts = records[0][3]
    max_ts = base_ts
    body = bytearray()
    for i, (key, value, headers, ts) in enumerate(records):
        max_ts = max(max_ts, ts)
        body += encode_record(i, ts - base_ts, key, value, headers)
    return wrap_records(body, len(records), base_ts, max_ts, base_offset=base_offset,
                        compression=compression, producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=base_sequence,
                        is_transactional=is_transactional, is_control=is_control,
                        timestamp_type=timestamp_type,
                        partition_leader_epoch=partition_leader_epoch)


def wrap_records(
    body: bytes | bytearray | memoryview,
    count: int,
    base_timestamp: int,
    max_timestamp: int,
    *,
    base_offset: int = 0,
    compression: Compression | int = Compression.NONE,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    timestamp_type: int = TIMESTAMP_CREATE_TIME,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A batch around ``count`` already encoded records (offset deltas 0..count-1, timestamp
    deltas from ``base_timestamp``): compressed, header, CRC. ``build_batch`` and the column
    codec (records/columnar.py) both end here."""
    codec = Compression(compression)
    payload = _compress(codec, bytes(body)) if codec else body
    attrs = int(codec)
    if timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
        attrs |= ATTR_TIMESTAMP_TYPE
    if is_transactional:
        attrs |= ATTR_TRANSACTIONAL
    if is_control:
        attrs |= ATTR_CONTROL
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(
        out, 0, base_offset, size - LOG_OVERHEAD, partition_leader_epoch, MAGIC, 0, attrs,
        count - 1, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
        count,
    )
    out[HEADER_SIZE:] = payload
    _I.pack_into(out, CRC_OFFSET, batch_crc(out, 0, size))
    return bytes(out)


def rebuild_batch(header: BatchHeader, records: Sequence[Record], base_timestamp: int,
                  attributes: int) -> bytes:
    """The batch ``header`` with only ``records`` left (Kafka's buildRetainedRecordsInto, the
    log cleaner's output): the same base offset, lastOffsetDelta (so that the producer's last
    sequence survives: spec 000, "Discussion on PID Expiration for Compacted Topics"),
    producer fields, leader epoch and codec; each record keeps its offset; timestamps are
    re-based on ``base_timestamp`` (the delete horizon once stamped, KIP-534)."""
    if not records:
        raise ValueError("a rebuilt batch keeps at least one record (else: empty_batch)")
    log_append = header.timestamp_type == TIMESTAMP_LOG_APPEND_TIME
    body = bytearray()
    max_ts = NO_TIMESTAMP
    for r in records:
        ts = base_timestamp if log_append else r.timestamp
        max_ts = max(max_ts, ts)
        body += encode_record(r.offset - header.base_offset, ts - base_timestamp, r.key,
                              r.value, r.headers)
    if log_append:
        max_ts = header.max_timestamp
    codec = Compression(attributes & ATTR_COMPRESSION_MASK)
    payload = _compress(codec, bytes(body)) if codec else bytes(body)
    size = HEADER_SIZE + len(payload)
    out = bytearray(size)
    _HEADER.pack_into(
        out, 0, header.base_offset, size - LOG_OVERHEAD, header.partition_leader_epoch, MAGIC,
        0, attributes, header.last_offset_delta, base_timestamp, max_ts, header.producer_id,
        header.producer_epoch, header.base_sequence, len(records))
    out[HEADER_SIZE:] = payload
    _I.pack_into(out, CRC_OFFSET, batch_crc(out, 0, size))
    return bytes(out)


def empty_batch(header: BatchHeader) -> bytes:
    """The header of ``header``'s batch with no records (Kafka's writeEmptyHeader): what the
    cleaner keeps of a batch that holds a producer's last sequence or epoch once its records
    are gone, so that the producer state survives a restart."""
    attributes = header.attributes & (ATTR_TIMESTAMP_TYPE | ATTR_TRANSACTIONAL | ATTR_CONTROL)
    out = bytearray(HEADER_SIZE)
    _HEADER.pack_into(
        out, 0, header.base_offset, HEADER_SIZE - LOG_OVERHEAD, header.partition_leader_epoch,
        MAGIC, 0, attributes, header.last_offset_delta, NO_TIMESTAMP, header.max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, 0)
    _I.pack_into(out, CRC_OFFSET, batch_crc(out, 0, HEADER_SIZE))
    return bytes(out)


# --- control records (spec 000, "Control Messages for Transactions") ------------------------

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")


def build_control_batch(
    control_type: int,
    *,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A transaction marker: one control record, key (version, type), value (version, epoch)."""
    key = _CONTROL_KEY.pack(0, control_type)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return build_batch(
        [(key, value, (), timestamp)],
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=NO_SEQUENCE,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
    )


def parse_control_record(record: Record) -> tuple[int, int]:
    """Return (control type, coordinator epoch) of a control record."""
    if record.key is None or len(record.key) < 4:
        raise CorruptRecordError("control record key too short")
    _version, ctype = _CONTROL_KEY.unpack_from(record.key)
    epoch = -1
    if record.value is not None and len(record.value) >= 6:
        _v, epoch = _CONTROL_VALUE.unpack_from(record.value)
    return ctype, epoch

"""Kafka's LogValidator for a producer's batches, before the partition leader appends them.

``validate_records`` checks the records inside each batch (their keys on a compacted topic, and
on a CreateTime topic their timestamps, whose largest becomes the batch's maxTimestamp); a
refusal about single records lists them (KIP-467's record_errors). ``convert_compression`` applies the topic's ``compression.type``: ``producer`` keeps
every batch as sent; a codec (or ``uncompressed``) rebuilds a batch written with another one, as
Kafka's buildRecordsAndAssignOffsets does: the same records (keys, values, headers, timestamps,
consecutive offset deltas), producer id, epoch, base sequence and transactional flag, in a batch
of the topic's codec at its configured level, with a new length and CRC. Offsets, the leader
epoch and LogAppendTime are assigned afterwards, as for any batch (log/log.py ``_write``), so a
rebuilt batch is deduplicated and sequenced exactly as the batch the producer sent. Control
batches are never rebuilt (Kafka: "do not compress control records unless they are written
compressed"); producers cannot send them anyway.
"""

from __future__ import annotations

import asyncio
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from kio.schema.errors import ErrorCode

from ..records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    PROBE_BYTES,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    CorruptRecordError,
    batch_crc,
    batch_payload,
    check_records,
    decode_batch,
    parse_header,
    set_max_timestamp,
)
from ..records.compression import Compression, compress

_LENGTH = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")
_CRC = struct.Struct(">I")

# compression.type -> the codec batches are stored with (None: the producer's).
_TARGETS = {"producer": None, "uncompressed": Compression.NONE, "gzip": Compression.GZIP,
            "snappy": Compression.SNAPPY, "lz4": Compression.LZ4, "zstd": Compression.ZSTD}


class ValidatorConfig(Protocol):
    """What the validator reads of a LogConfig."""

    message_timestamp_type: str
    message_timestamp_before_max_ms: int
    message_timestamp_after_max_ms: int
    compression_type: str
    max_message_bytes: int
    compression_gzip_level: int
    compression_lz4_level: int
    compression_zstd_level: int
    cleanup_policy: frozenset[str]


KEYLESS_MESSAGE = "Compacted topic cannot accept message without key in topic partition {}."

# (batch index, message): Kafka's RecordError, the ProduceResponse v8+ record_errors (KIP-467).
RecordError = tuple[int, str]


class RecordsError(Exception):
    """Batches the log refuses; ``error_name`` is the Kafka error code (ErrorCode);
    ``record_errors`` lists the refused records of the failing batch (KIP-467), when the
    refusal is about single records."""

    def __init__(self, error_name: ErrorCode, message: str,
                 record_errors: tuple[RecordError, ...] = ()) -> None:
        super().__init__(message)
        self.error_name = error_name
        self.record_errors = record_errors


def validate_records(config: ValidatorConfig, data, batches: list[tuple[int, BatchHeader]],
                     now_ms: int, partition: str = "",
                     checked: dict[int, tuple[int, int]] | None = None
                     ) -> tuple[bytes | bytearray, list[tuple[int, BatchHeader]]]:
    """The records inside each batch (records/batch.py ``check_records``: count, offset deltas,
    lengths, a payload that decompresses within records/compression.py's ``inflate_limit``);
    on a CreateTime topic every record's timestamp (but -1, "none") within
    [now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms] (KIP-937);
    on a compacted topic a key on every record. A producer may not claim LogAppendTime.

    Returns the data and its batches, where a CreateTime batch's maxTimestamp was not its largest
    record timestamp (or -1 when none is larger) rewritten with a new CRC (in ``data`` if it is
    a bytearray, else in a copy: the request's bytes are not copied otherwise), as Kafka's
    LogValidator does (setMaxTimestamp): librdkafka writes maxTimestamp 0 over records without
    timestamps, and the time index and retention trust the header. Batches already right are
    left alone. ``partition`` names the topic partition in record errors' messages.
    ``checked``: what ``check_compressed`` found of batches (at their positions), not read
    again."""
    create_time = config.message_timestamp_type == "CreateTime"
    compacted = "compact" in config.cleanup_policy
    before = config.message_timestamp_before_max_ms
    after = config.message_timestamp_after_max_ms
    out = batches
    for i, (pos, h) in enumerate(batches):
        if h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
            raise RecordsError(ErrorCode.invalid_timestamp, "a producer may not set the timestamp type "
                                                    "to LogAppendTime")
        try:
            got = checked.get(pos) if checked else None
            lo, hi = got or check_records(data, pos, h)  # type: ignore[misc]
            # The smallest and largest timestamps bound every record's: the per-record walk
            # below runs only for a batch that may hold a refused record.
            suspect = create_time and (hi - now_ms > after or now_ms - lo > before)
            if suspect or compacted:
                _check_each_record(data, pos, h, suspect, compacted,
                                   now_ms - before, now_ms + after, partition)
        except CorruptRecordError as exc:
            raise RecordsError(exc.error_name, f"batch of {h.records_count} records: {exc}"
                               ) from None
        max_timestamp = max(hi, NO_TIMESTAMP)
        if create_time and h.max_timestamp != max_timestamp:
            if type(data) is not bytearray:  # the request's bytes: rewritten in a copy
                data = bytearray(data)
            set_max_timestamp(data, pos, h.size, max_timestamp)
            if out is batches:
                out = list(batches)
            out[i] = (pos, parse_header(data, pos))
    return data, out


# Compressed batches whose records inflate past PROBE_BYTES are read in these threads, not on
# the event loop: cramjam releases the GIL while it inflates, so one connection's batches (or
# bombs) cost the other connections nothing but a core. Bounded: at most this many batches are
# inflated at once, the others wait their turn (their requests are already bounded by
# queued.max.request.bytes).
INFLATE_THREADS = max(1, min(4, os.cpu_count() or 1))
_pool: ThreadPoolExecutor | None = None


def _inflater() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(INFLATE_THREADS, thread_name_prefix="oncelog-inflate")
    return _pool


async def check_compressed(config: ValidatorConfig, data,
                           batches: list[tuple[int, BatchHeader]]
                           ) -> dict[int, tuple[int, int]]:
    """``check_records`` of the compressed batches of a produced record set, before the log
    appends it (pass the result to ``validate_records``): the first PROBE_BYTES of each payload
    inline (a bomb whose first records are bad is refused there), the rest, when there is
    more, in the inflate threads. RecordsError as ``validate_records``. Batches the log
    refuses before reading their records (too large, LogAppendTime) are left to it."""
    out: dict[int, tuple[int, int]] = {}
    for pos, h in batches:
        if not h.attributes & ATTR_COMPRESSION_MASK or h.size > config.max_message_bytes or \
                h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
            continue
        try:
            got = check_records(data, pos, h, give_up_past=PROBE_BYTES)
            if got is None:
                got = await asyncio.get_running_loop().run_in_executor(
                    _inflater(), check_records, data, pos, h)
        except CorruptRecordError as exc:
            raise RecordsError(exc.error_name, f"batch of {h.records_count} records: {exc}"
                               ) from None
        assert got is not None
        out[pos] = got
    return out


def _check_each_record(data, pos: int, h: BatchHeader, timestamps: bool, keys: bool,
                       earliest: int, latest: int, partition: str) -> None:
    """Kafka's LogValidator.validateRecord over every record of one batch: collect a
    RecordError per keyless record (compacted topics) and per timestamp out of
    [earliest, latest], and refuse the batch with all of them (processRecordErrors)."""
    errors: list[RecordError] = []
    bad_timestamp = False
    view = memoryview(data).toreadonly()  # the varint reader takes read-only buffers only
    for index, record in enumerate(decode_batch(view, pos, verify_crc=False)[1]):
        if keys and record.key is None:
            errors.append((index, KEYLESS_MESSAGE.format(partition)))
        ts = record.timestamp
        if timestamps and ts != NO_TIMESTAMP and not earliest <= ts <= latest:
            bad_timestamp = True
            message = (f"Timestamp {ts} of message with offset {record.offset} is out of "
                       f"range. The timestamp should be within [{earliest}, {latest}] "
                       "(message.timestamp.before.max.ms, message.timestamp.after.max.ms)")
            errors.append((index, message))
    if not errors:
        return
    if bad_timestamp:
        raise RecordsError(ErrorCode.invalid_timestamp, "One or more records have been rejected due "
                           "to invalid timestamp", tuple(errors))
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    raise RecordsError(ErrorCode.invalid_record, "One or more records have been rejected due to "
                       f"{len(errors)} record errors in total, and only showing the first "
                       f"three errors at most: [{shown}]", tuple(errors))


def target_codec(config: ValidatorConfig) -> Compression | None:
    """The codec the topic stores batches with; None for the producer's own."""
    return _TARGETS[config.compression_type]


def _level(config: ValidatorConfig, codec: Compression) -> int | None:
    return {Compression.GZIP: config.compression_gzip_level,
            Compression.LZ4: config.compression_lz4_level,
            Compression.ZSTD: config.compression_zstd_level}.get(codec)


def convert_compression(config: ValidatorConfig, data, batches: list[tuple[int, BatchHeader]]
                        ) -> tuple[bytearray, list[tuple[int, BatchHeader]]] | None:
    """The record set rebuilt in the topic's codec, or None when every batch already has it
    (or the topic keeps the producer's). Call after ``validate_records``."""
    target = target_codec(config)
    if target is None or all((h.attributes & ATTR_COMPRESSION_MASK) == target or h.is_control
                             for _pos, h in batches):
        return None
    level = _level(config, target)
    out = bytearray()
    converted: list[tuple[int, BatchHeader]] = []
    for pos, h in batches:
        if (h.attributes & ATTR_COMPRESSION_MASK) == target or h.is_control:
            chunk = bytearray(memoryview(data)[pos:pos + h.size])
        else:
            chunk = recompress(data, pos, h, target, level)
        converted.append((len(out), parse_header(chunk)))
        out += chunk
    return out, converted


def recompress(data, pos: int, h: BatchHeader, codec: Compression, level: int | None
               ) -> bytearray:
    """The batch at ``pos`` with its records compressed by ``codec``: the header as it was
    (offsets, timestamps, producer fields, count) but for the codec bits, the length and the
    CRC."""
    records = bytes(batch_payload(data, pos, h))
    body = compress(codec, records, level)
    out = bytearray(memoryview(data)[pos:pos + HEADER_SIZE])
    out += body
    _LENGTH.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    attributes = (h.attributes & ~ATTR_COMPRESSION_MASK) | int(codec)
    _ATTRIBUTES.pack_into(out, ATTRIBUTES_OFFSET, attributes)
    _CRC.pack_into(out, CRC_OFFSET, batch_crc(out, 0, len(out)))
    return out

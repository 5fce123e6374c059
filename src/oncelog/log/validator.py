"""Kafka's LogValidator for a producer's batches, before the partition leader appends them.

``validate_records`` checks the records inside each batch and, on a CreateTime topic, their
timestamps. ``convert_compression`` applies the topic's ``compression.type``: ``producer`` keeps
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

import struct
from typing import Protocol

from ..records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_TIMESTAMP,
    TIMESTAMP_LOG_APPEND_TIME,
    BatchHeader,
    CorruptRecordError,
    batch_crc,
    batch_payload,
    check_records,
    has_keyless_record,
    parse_header,
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
    compression_gzip_level: int
    compression_lz4_level: int
    compression_zstd_level: int
    cleanup_policy: frozenset[str]


class RecordsError(Exception):
    """Batches the log refuses; ``error_name`` is the Kafka error code's name."""

    def __init__(self, error_name: str, message: str) -> None:
        super().__init__(message)
        self.error_name = error_name


def validate_records(config: ValidatorConfig, data, batches: list[tuple[int, BatchHeader]],
                     now_ms: int) -> None:
    """The records inside each batch (records/batch.py ``check_records``: count, offset deltas,
    lengths, a payload that decompresses within records/compression.py's ``inflate_limit``)
    and, on a CreateTime topic, every record's timestamp within
    [now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms] (KIP-937).
    A producer may not claim LogAppendTime."""
    create_time = config.message_timestamp_type == "CreateTime"
    before = config.message_timestamp_before_max_ms
    after = config.message_timestamp_after_max_ms
    for pos, h in batches:
        if h.timestamp_type == TIMESTAMP_LOG_APPEND_TIME:
            raise RecordsError("invalid_timestamp", "a producer may not set the timestamp type "
                                                    "to LogAppendTime")
        try:
            lo, hi = check_records(data, pos, h)
        except CorruptRecordError as exc:
            raise RecordsError(exc.error_name, f"batch of {h.records_count} records: {exc}"
                               ) from None
        if not create_time or hi == NO_TIMESTAMP:
            continue
        if hi - now_ms > after or (lo != NO_TIMESTAMP and now_ms - lo > before):
            bad = hi if hi - now_ms > after else lo
            raise RecordsError(
                "invalid_timestamp",
                f"timestamp {bad} is out of range: it must lie within "
                f"[{now_ms - before}, {now_ms + after}] (message.timestamp.before.max.ms, "
                f"message.timestamp.after.max.ms)")
    # Kafka's LogValidator: the cleaner keeps the latest record per key, so each needs one.
    if "compact" in config.cleanup_policy and any(has_keyless_record(data, pos, h)
                                                  for pos, h in batches):
        raise RecordsError("invalid_record", "a compacted topic cannot accept a record without "
                           "a key")


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

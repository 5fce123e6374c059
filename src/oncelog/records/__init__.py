"""The v2 record batch: encode, decode, CRC32C, control records. Pure functions on bytes."""

from .batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    HEADER_SIZE,
    BatchHeader,
    CorruptRecordError,
    Record,
    build_batch,
    build_control_batch,
    decode_batch,
    increment_sequence,
    iter_batches,
    parse_control_record,
    parse_header,
    set_base_offset,
    set_log_append_time,
    split_batches,
    validate_batch,
)
from .compression import Compression

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "HEADER_SIZE",
    "BatchHeader",
    "Compression",
    "CorruptRecordError",
    "Record",
    "build_batch",
    "build_control_batch",
    "decode_batch",
    "increment_sequence",
    "iter_batches",
    "parse_control_record",
    "parse_header",
    "set_base_offset",
    "set_log_append_time",
    "split_batches",
    "validate_batch",
]

"""``oncelog dump-log``: print a segment's batches, one line each, like Kafka's DumpLogSegments.

    baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 0 lastSequence: 2 producerId: 0
    producerEpoch: 0 partitionLeaderEpoch: -1 isTransactional: false isControl: false
    position: 0 CreateTime: 1700000000000 size: 100 magic: 2 compresscodec: none
    crc: 123456 isvalid: true

A torn or corrupt tail is reported, not hidden.
"""

from __future__ import annotations

import os
import struct
import sys

from ..records.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    CorruptRecordError,
    batch_crc,
    decode_batch,
    parse_control_record,
    parse_header,
)

_OFFSET_LENGTH = struct.Struct(">qi")


def _fmt_bytes(b: bytes | None) -> str:
    if b is None:
        return "null"
    return b.decode("utf-8", "backslashreplace")


def dump_segment(path: str, print_data: bool, out=sys.stdout) -> int:
    """Print one line per batch; return the number of problems found (0 = clean)."""
    with open(path, "rb") as f:
        data = f.read()
    print(f"Dumping {path}", file=out)
    pos = 0
    problems = 0
    while pos < len(data):
        if len(data) - pos < HEADER_SIZE:
            print(f"Found {len(data) - pos} trailing bytes at position {pos}: a torn batch "
                  "header", file=out)
            return problems + 1
        h = parse_header(data, pos)
        if h.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + h.size > len(data):
            print(f"Found a truncated batch at position {pos}: needs {h.size} bytes, "
                  f"{len(data) - pos} remain", file=out)
            return problems + 1
        valid = h.magic == 2 and batch_crc(data, pos, h.size) == h.crc
        ts_name = "LogAppendTime" if h.timestamp_type else "CreateTime"
        print(
            f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
            f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} "
            f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
            f"partitionLeaderEpoch: {h.partition_leader_epoch} "
            f"isTransactional: {str(h.is_transactional).lower()} "
            f"isControl: {str(h.is_control).lower()} position: {pos} "
            f"{ts_name}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
            f"compresscodec: {h.compression.name.lower()} crc: {h.crc} "
            f"isvalid: {str(valid).lower()}",
            file=out,
        )
        if not valid:
            problems += 1
        elif print_data:
            try:
                _, records = decode_batch(data, pos, verify_crc=False)
            except CorruptRecordError as exc:
                print(f"| cannot decode records: {exc}", file=out)
                problems += 1
            else:
                for r in records:
                    if h.is_control:
                        ctype, epoch = parse_control_record(r)
                        kind = {0: "ABORT", 1: "COMMIT"}.get(ctype, f"UNKNOWN({ctype})")
                        print(f"| offset: {r.offset} {ts_name}: {r.timestamp} "
                              f"endTxnMarker: {kind} coordinatorEpoch: {epoch}", file=out)
                        continue
                    headers = ",".join(f"{k}:{_fmt_bytes(v)}" for k, v in r.headers)
                    print(f"| offset: {r.offset} {ts_name}: {r.timestamp} "
                          f"keySize: {-1 if r.key is None else len(r.key)} "
                          f"valueSize: {-1 if r.value is None else len(r.value)} "
                          f"headerKeys: [{headers}] key: {_fmt_bytes(r.key)} "
                          f"payload: {_fmt_bytes(r.value)}", file=out)
        pos += h.size
    return problems


def dump_files(paths: list[str], print_data: bool) -> int:
    problems = 0
    for path in paths:
        if not os.path.isfile(path):
            print(f"oncelog dump-log: {path}: no such file", file=sys.stderr)
            return 2
        problems += dump_segment(path, print_data)
    return 1 if problems else 0

"""``oncelog dump-log``: print a segment's batches, one line each, like Kafka's DumpLogSegments.

    baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 0 lastSequence: 2 producerId: 0
    producerEpoch: 0 partitionLeaderEpoch: -1 isTransactional: false isControl: false
    position: 0 CreateTime: 1700000000000 size: 100 magic: 2 compresscodec: none
    crc: 123456 isvalid: true

A torn or corrupt tail is reported, not hidden. A batch the log cleaner stamped shows its
delete horizon (KIP-534). ``--transaction-log-decoder`` and ``--offsets-decoder`` print the
records of ``__transaction_state`` and ``__consumer_offsets`` decoded, as Kafka's tool does
(``<DELETE>`` for a tombstone). An offset index, time index, aborted-transaction index or
producer snapshot is printed as the entries it holds; so is a file the cleaner left with a
``.cleaned`` or ``.swap`` suffix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import sys
from pathlib import Path

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
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_TXN_ENTRY = struct.Struct(">hqqqq")


def _fmt_bytes(b: bytes | None) -> str:
    if b is None:
        return "null"
    return b.decode("utf-8", "backslashreplace")


def _json(obj) -> str:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        obj = dataclasses.asdict(obj)
    return json.dumps(obj, default=lambda v: v.hex() if isinstance(v, bytes) else str(v))


def _decoded(decoder: str, key: bytes | None, value: bytes | None) -> str:
    """``key: ... payload: ...`` of an internal topic's record (Kafka's decoders)."""
    try:
        if decoder == "transaction-log":
            from ..txn import log_format as txn_format

            txn_id = txn_format.decode_key(key or b"")
            shown = _json({"type": "transaction_metadata", "transactionalId": txn_id})
            payload = "<DELETE>" if value is None else _json(
                txn_format.decode_value(txn_id, value))
        else:
            from ..group import log_format as group_format

            k = group_format.decode_key(key or b"")
            is_offset = isinstance(k, group_format.OffsetKey)
            kind = "offset_commit" if is_offset else "group_metadata"
            shown = _json({"type": kind, "data": dataclasses.asdict(k)})
            payload = "<DELETE>" if value is None else _json(
                group_format.decode_offset(value) if is_offset
                else group_format.decode_group(value))
    except ValueError as exc:
        return f"key: {_fmt_bytes(key)} payload: (cannot decode: {exc})"
    return f"key: {shown} payload: {payload}"


def dump_index(path: str, out=sys.stdout) -> int:
    """The entries of an index file (offset, time, aborted-transaction) or of a producer
    snapshot; the kind is its name's suffix. Returns the number of problems."""
    name = Path(path).name
    for suffix in (".cleaned", ".swap"):
        name = name.removesuffix(suffix)
    stem, _, kind = name.partition(".")
    base = int(stem) if stem.isdigit() else 0
    with open(path, "rb") as f:
        data = f.read()
    print(f"Dumping {path}", file=out)
    if kind == "snapshot":
        from ..log.producer_state import ProducerStateManager

        try:
            state = ProducerStateManager.from_snapshot(data)
        except ValueError as exc:
            print(f"Not a readable producer snapshot: {exc}", file=out)
            return 1
        for e in state.producers.values():
            last = e.batches[-1] if e.batches else None
            print(f"producerId: {e.producer_id} producerEpoch: {e.producer_epoch} "
                  f"coordinatorEpoch: {e.coordinator_epoch} "
                  f"currentTxnFirstOffset: {e.current_txn_first_offset} "
                  f"lastTimestamp: {e.last_timestamp} "
                  f"firstSequence: {last.first_seq if last else -1} "
                  f"lastSequence: {last.last_seq if last else -1} "
                  f"lastOffset: {last.last_offset if last else -1} "
                  f"offsetDelta: {last.offset_delta if last else 0}", file=out)
        return 0
    entry = {"index": _OFFSET_ENTRY, "timeindex": _TIME_ENTRY, "txnindex": _TXN_ENTRY}[kind]
    whole = len(data) - len(data) % entry.size
    for fields in entry.iter_unpack(data[:whole]):
        if kind == "index":
            print(f"offset: {base + fields[0]} position: {fields[1]}", file=out)
        elif kind == "timeindex":
            print(f"timestamp: {fields[0]} offset: {base + fields[1]}", file=out)
        else:
            print(f"version: {fields[0]} producerId: {fields[1]} firstOffset: {fields[2]} "
                  f"lastOffset: {fields[3]} lastStableOffset: {fields[4]}", file=out)
    if whole != len(data):
        print(f"Found {len(data) - whole} trailing bytes: not a whole {entry.size}-byte "
              "entry", file=out)
        return 1
    return 0


def dump_segment(path: str, print_data: bool, out=sys.stdout, decoder: str | None = None
                 ) -> int:
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
            f"isControl: {str(h.is_control).lower()} "
            f"deleteHorizonMs: {h.delete_horizon_ms if h.delete_horizon_ms is not None else 'none'}"
            f" position: {pos} "
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
                    if decoder is not None:
                        print(f"| offset: {r.offset} {ts_name}: {r.timestamp} "
                              f"{_decoded(decoder, r.key, r.value)}", file=out)
                        continue
                    headers = ",".join(f"{k}:{_fmt_bytes(v)}" for k, v in r.headers)
                    print(f"| offset: {r.offset} {ts_name}: {r.timestamp} "
                          f"keySize: {-1 if r.key is None else len(r.key)} "
                          f"valueSize: {-1 if r.value is None else len(r.value)} "
                          f"headerKeys: [{headers}] key: {_fmt_bytes(r.key)} "
                          f"payload: {_fmt_bytes(r.value)}", file=out)
        pos += h.size
    return problems


INDEX_KINDS = (".index", ".timeindex", ".txnindex", ".snapshot")


def dump_files(paths: list[str], print_data: bool, decoder: str | None = None) -> int:
    """``decoder``: "transaction-log" or "offsets" (implies ``print_data``)."""
    problems = 0
    for path in paths:
        if not os.path.isfile(path):
            what = "a directory, not a segment file" if os.path.isdir(path) else "no such file"
            print(f"oncelog dump-log: {path}: {what}", file=sys.stderr)
            return 2
        name = path.removesuffix(".cleaned").removesuffix(".swap")
        if name.endswith(INDEX_KINDS):
            problems += dump_index(path)
        else:
            problems += dump_segment(path, print_data or decoder is not None, decoder=decoder)
    return 1 if problems else 0

"""``oncelog dump-log``: print a segment's batches and records as Kafka's kafka-dump-log
(DumpLogSegments) prints them, with its flags: ``--files a.log,b.index`` (or the files as
arguments), ``--deep-iteration`` (a line per record), ``--print-data-log`` (the records' keys
and payloads too; implies deep iteration; ``--print-data`` is its old name here),
``--transaction-log-decoder`` / ``--offsets-decoder`` (the internal topics' records as Kafka's
JSON; imply ``--print-data-log``), ``--skip-record-metadata``, ``--index-sanity-check`` and
``--verify-index-only`` (index files checked, their entries not printed). The lines::

    Dumping 00000000000000000000.log
    Log starting offset: 0
    baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 0 lastSequence: 2 producerId: 1000
    producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false
    deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1700000000000 size: 100
    magic: 2 compresscodec: none crc: 123456 isvalid: true
    | offset: 0 CreateTime: 1700000000000 keySize: -1 valueSize: 5 sequence: 0
    headerKeys: [] payload: hello

(a batch or a record on one line each). A control record shows ``endTxnMarker: COMMIT
coordinatorEpoch: 0``. Records whose offsets do not follow each other are reported on stderr
at the end ("Non-consecutive offsets in ..."), as Kafka does. Beyond Kafka: a torn or corrupt
tail is described, not only counted; a file the cleaner left with a ``.cleaned`` or ``.swap``
suffix is read as what it was. An offset index, time index, aborted-transaction index or
producer snapshot is printed as the entries it holds.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

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
_VERSION = struct.Struct(">h")


def add_arguments(d: argparse.ArgumentParser) -> None:
    """kafka-dump-log's flags (and this tool's older spellings)."""
    d.add_argument("paths", nargs="*", metavar="FILE",
                   help="segment, index or snapshot files (or --files)")
    d.add_argument("--files", action="append", default=[], metavar="FILE1,FILE2",
                   help="the comma-separated list of data and index files to dump, as "
                   "kafka-dump-log takes them")
    d.add_argument("--print-data-log", "--print-data", dest="print_data", action="store_true",
                   help="print the records' keys and payloads (implies --deep-iteration)")
    d.add_argument("--deep-iteration", action="store_true",
                   help="a line per record, not only per batch")
    d.add_argument("--skip-record-metadata", action="store_true",
                   help="with --print-data-log: the record lines hold only key and payload")
    d.add_argument("--index-sanity-check", action="store_true",
                   help="for index files: only whether they are sound (entries whole, "
                   "offsets growing), not their entries")
    d.add_argument("--verify-index-only", action="store_true",
                   help="for offset index files: check each entry against the segment "
                   "beside it, print only the mismatches (on stderr)")
    decoders = d.add_mutually_exclusive_group()
    decoders.add_argument("--transaction-log-decoder", action="store_const", dest="decoder",
                          const="transaction-log",
                          help="decode __transaction_state records as Kafka's JSON "
                          "(implies --print-data-log)")
    decoders.add_argument("--offsets-decoder", action="store_const", dest="decoder",
                          const="offsets",
                          help="decode __consumer_offsets records as Kafka's JSON (implies "
                          "--print-data-log)")


def run(args: argparse.Namespace) -> int:
    paths = list(args.paths) + [f for given in args.files for f in given.split(",") if f]
    if not paths:
        print("oncelog dump-log: give the files to dump (--files FILE1,FILE2 or as "
              "arguments)", file=sys.stderr)
        return 2
    return dump_files(paths, args.print_data, args.decoder, args.deep_iteration,
                      args.skip_record_metadata, args.index_sanity_check,
                      args.verify_index_only)


def _fmt_bytes(b: bytes | None) -> str:
    if b is None:
        return "null"
    return b.decode("utf-8", "backslashreplace")


def _json(obj: Any) -> str:
    """Compact JSON, as Kafka's Jackson writes it (binary as base64)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                      default=lambda v: base64.b64encode(v).decode() if isinstance(v, bytes)
                      else str(v))


def _version(data: bytes) -> int:
    return _VERSION.unpack_from(data, 0)[0] if len(data) >= 2 else -1


def _txn_key_value(key: bytes | None, value: bytes | None) -> tuple[str, str | None]:
    """Kafka's transaction-log decoder: ``{"type":"0","data":{"transactionalId":...}}`` and
    ``{"version":"1","data":{...}}``, the fields as TransactionLogValue names them (its
    tagged fields only when not at their defaults)."""
    from ..txn import log_format as txn_format
    from ..txn.state import TransactionState

    if key is None or len(key) < 2:
        raise ValueError("not a transaction log record: its key is "
                         + ("null" if key is None else f"{len(key)} bytes"))
    txn_id = txn_format.decode_key(key)
    shown = _json({"type": str(_version(key or b"")),
                   "data": {"transactionalId": txn_id}})
    if value is None:
        return shown, "<DELETE>"
    m = txn_format.decode_value(txn_id, value)
    version = _version(value)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(m.partitions):
        by_topic.setdefault(topic, []).append(partition)
    data: dict[str, Any] = {"producerId": m.producer_id}
    if version >= 1 and m.last_producer_id != -1:
        data["previousProducerId"] = m.last_producer_id
    if version >= 1 and m.next_producer_id != -1:
        data["nextProducerId"] = m.next_producer_id
    data.update({
        "producerEpoch": m.producer_epoch,
        "transactionTimeoutMs": m.txn_timeout_ms,
        "transactionStatus": m.state.id,
        "transactionPartitions": None if m.state is TransactionState.EMPTY and not by_topic
        else [{"topic": t, "partitionIds": ps} for t, ps in by_topic.items()],
        "transactionLastUpdateTimestampMs": m.txn_last_update_ms,
        "transactionStartTimestampMs": m.txn_start_ms,
    })
    if version >= 1 and m.client_txn_version != 0:
        data["clientTransactionVersion"] = m.client_txn_version
    return shown, _json({"version": str(version), "data": data})


def _consumer_protocol(field: str, data: bytes) -> Any:
    """A consumer group member's subscription or assignment as JSON (Kafka decodes them for
    groups of protocol type "consumer"); the bytes (base64) when they do not decode."""
    from ..client.consumer.assignors import decode_assignment, decode_subscription
    from ..protocol import ProtocolError

    try:
        if field == "subscription":
            sub = decode_subscription(data)
            owned: dict[str, list[int]] = {}
            for tp in sub.owned_partitions:
                owned.setdefault(tp.topic, []).append(tp.partition)
            return {"topics": list(sub.topics), "userData": sub.user_data,
                    "ownedPartitions": [{"topic": t, "partitions": ps}
                                        for t, ps in owned.items()]}
        assigned: dict[str, list[int]] = {}
        for tp in decode_assignment(data):
            assigned.setdefault(tp.topic, []).append(tp.partition)
        return {"assignedPartitions": [{"topic": t, "partitions": ps}
                                       for t, ps in assigned.items()], "userData": None}
    except (ProtocolError, ValueError, struct.error):
        return data


def _offsets_key_value(key: bytes | None, value: bytes | None) -> tuple[str, str | None]:
    """Kafka's offsets decoder: ``{"type":"1","data":{"group":..,"topic":..,"partition":..}}``
    (an offset commit; type 2: a group's metadata) and ``{"version":"3","data":{...}}``."""
    from ..group import log_format as group_format

    if key is None or len(key) < 2:
        raise ValueError("not an offsets topic record: its key is "
                         + ("null" if key is None else f"{len(key)} bytes"))
    k = group_format.decode_key(key)
    is_offset = isinstance(k, group_format.OffsetKey)
    key_data: dict[str, Any] = {"group": k.group}
    if isinstance(k, group_format.OffsetKey):
        key_data.update({"topic": k.topic, "partition": k.partition})
    shown = _json({"type": str(_version(key or b"")), "data": key_data})
    if value is None:
        return shown, "<DELETE>"
    version = str(_version(value))
    if is_offset:
        o = group_format.decode_offset(value)
        return shown, _json({"version": version, "data": {
            "offset": o.offset, "leaderEpoch": o.leader_epoch, "metadata": o.metadata,
            "commitTimestamp": o.commit_timestamp}})
    g = group_format.decode_group(value)
    consumer = g.protocol_type == "consumer"
    members = [{"memberId": m.member_id, "groupInstanceId": m.group_instance_id,
                "clientId": m.client_id, "clientHost": m.client_host,
                "rebalanceTimeout": m.rebalance_timeout_ms,
                "sessionTimeout": m.session_timeout_ms,
                "subscription": _consumer_protocol("subscription", m.subscription)
                if consumer else m.subscription,
                "assignment": _consumer_protocol("assignment", m.assignment)
                if consumer else m.assignment} for m in g.members]
    return shown, _json({"version": version, "data": {
        "protocolType": g.protocol_type, "generation": g.generation, "protocol": g.protocol,
        "leader": g.leader, "currentStateTimestamp": g.current_state_timestamp,
        "members": members}})


def _decoded(decoder: str, offset: int, key: bytes | None, value: bytes | None
             ) -> tuple[str, str | None]:
    """An internal topic's record as Kafka's decoders print it: (key, payload)."""
    try:
        if decoder == "transaction-log":
            return _txn_key_value(key, value)
        return _offsets_key_value(key, value)
    except ValueError as exc:
        return f"Error at offset {offset}, skipping. {exc}", None


def _index_sanity(kind: str, base: int, entries: list[tuple[int, ...]]) -> str | None:
    """What is wrong with an offset or time index's entries (None: nothing): offsets that do
    not grow (Kafka's sanity check looks at the last one only), positions or timestamps that
    go back."""
    last: tuple[int, ...] | None = None
    for i, e in enumerate(entries):
        offset = base + (e[0] if kind == "index" else e[1])
        if offset < base:
            return f"entry {i}: offset {offset} below the base offset {base}"
        if last is not None:
            prev = base + (last[0] if kind == "index" else last[1])
            if offset < prev or (kind == "index" and offset == prev):
                return f"entry {i}: offset {offset} after {prev}"
            if kind == "index" and e[1] <= last[1]:
                return f"entry {i}: position {e[1]} after {last[1]}"
            if kind == "timeindex" and e[0] < last[0]:
                return f"entry {i}: timestamp {e[0]} after {last[0]}"
        last = e
    return None


def _index_mismatches(path: str, base: int, entries: list[tuple[int, ...]]
                      ) -> list[tuple[int, int]]:
    """(index offset, log offset) where an offset index entry does not point at the batch it
    names in the segment beside it (-1: no batch there). An entry holds the last offset of
    the batch at its position (Kafka's LogSegment writes them so): that is what is compared."""
    log_path = Path(path).with_name(Path(path).name.split(".")[0] + ".log")
    try:
        data = log_path.read_bytes()
    except OSError:
        return [(base + e[0], -1) for e in entries]
    out = []
    for relative, position in entries:
        found = -1
        if 0 <= position and position + HEADER_SIZE <= len(data):
            found = parse_header(data, position).last_offset
        if found != base + relative:
            out.append((base + relative, found))
    return out


def dump_index(path: str, out=sys.stdout, sanity_only: bool = False,
               verify_only: bool = False,
               mismatches: dict[str, list[tuple[int, int]]] | None = None) -> int:
    """The entries of an index file (offset, time, aborted-transaction) or of a producer
    snapshot; the kind is its name's suffix. Returns the number of problems.
    ``sanity_only`` (--index-sanity-check): only whether an offset or time index is sound;
    ``verify_only`` (--verify-index-only): no entries printed, an offset index's entries
    checked against its segment (into ``mismatches``, printed at the end)."""
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
    entries = list(entry.iter_unpack(data[:whole]))
    if kind in ("index", "timeindex"):
        # a preallocated index is zeros past its last entry: stop at the first such (Kafka)
        zero = next((i for i, e in enumerate(entries) if i > 0
                     and (e[0] if kind == "index" else e[1]) == 0), None)
        entries = entries[:zero]
        if not entries and whole == len(data):
            print(f"{path} is empty.", file=out)
            return 0
        if sanity_only:
            problem = _index_sanity(kind, base, entries) if whole == len(data) else \
                f"{len(data) - whole} trailing bytes: not a whole {entry.size}-byte entry"
            print(f"{path} passed sanity check." if problem is None else
                  f"{path} failed sanity check: {problem}", file=out)
            return 0 if problem is None else 1
        if verify_only:
            if kind == "index" and mismatches is not None:
                found = _index_mismatches(path, base, entries)
                if found:
                    mismatches[os.path.abspath(path)] = found
            entries = []
    for fields in entries:
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


def _record_line(h, r, ts_name: str, print_data: bool, decoder: str | None,
                 skip_metadata: bool) -> str:
    """One record, as DumpLogSegments prints it under a batch."""
    parts = ["|"]
    if not skip_metadata:
        sequence = h.base_sequence + (r.offset - h.base_offset) if h.base_sequence >= 0 \
            else -1
        if sequence > 0x7FFFFFFF:
            sequence -= 0x80000000  # Kafka's sequences wrap to 0 past Integer.MAX_VALUE
        parts.append(f"offset: {r.offset} {ts_name}: {r.timestamp} "
                     f"keySize: {-1 if r.key is None else len(r.key)} "
                     f"valueSize: {-1 if r.value is None else len(r.value)} "
                     f"sequence: {sequence} "
                     f"headerKeys: [{','.join(k for k, _ in r.headers)}]")
        if h.is_control:
            ctype, epoch = parse_control_record(r)
            kind = {0: "ABORT", 1: "COMMIT"}.get(ctype)
            parts.append(f"endTxnMarker: {kind} coordinatorEpoch: {epoch}" if kind else
                         f"controlType: UNKNOWN({ctype})")
    if print_data and not h.is_control:
        key: str | None
        payload: str | None
        if decoder is not None:
            key, payload = _decoded(decoder, r.offset, r.key, r.value)
        else:
            key = None if r.key is None else _fmt_bytes(r.key)
            payload = None if r.value is None else _fmt_bytes(r.value)
        if key is not None:
            parts.append(f"key: {key}")
        if payload is not None:
            parts.append(f"payload: {payload}")
    return " ".join(parts)


def dump_segment(path: str, print_data: bool, out=sys.stdout, decoder: str | None = None,
                 deep: bool = False, skip_metadata: bool = False,
                 gaps: list[tuple[int, int]] | None = None) -> int:
    """Print one line per batch (and with ``deep`` or ``print_data``, per record); return the
    number of problems found (0 = clean). ``gaps``: where a record's offset does not follow
    the one before (Kafka's "Non-consecutive offsets")."""
    deep = deep or print_data
    with open(path, "rb") as f:
        data = f.read()
    name = Path(path).name
    print(f"Dumping {path}", file=out)
    stem = name.removesuffix(".cleaned").removesuffix(".swap").partition(".")[0]
    if stem.isdigit():
        print(f"Log starting offset: {int(stem)}", file=out)
    pos = 0
    problems = 0
    last_offset = -1
    while pos < len(data):
        if len(data) - pos < HEADER_SIZE:
            print(f"Found {len(data) - pos} invalid bytes at the end of {name} (a torn "
                  f"batch header: trailing bytes at position {pos})", file=out)
            return problems + 1
        h = parse_header(data, pos)
        if h.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + h.size > len(data):
            print(f"Found {len(data) - pos} invalid bytes at the end of {name} (a truncated "
                  f"batch at position {pos}: needs {h.size} bytes, {len(data) - pos} "
                  "remain)", file=out)
            return problems + 1
        valid = h.magic == 2 and batch_crc(data, pos, h.size) == h.crc
        ts_name = "LogAppendTime" if h.timestamp_type else "CreateTime"
        horizon = "OptionalLong.empty" if h.delete_horizon_ms is None \
            else f"OptionalLong[{h.delete_horizon_ms}]"
        print(
            f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
            f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} "
            f"producerId: {h.producer_id} producerEpoch: {h.producer_epoch} "
            f"partitionLeaderEpoch: {h.partition_leader_epoch} "
            f"isTransactional: {str(h.is_transactional).lower()} "
            f"isControl: {str(h.is_control).lower()} "
            f"deleteHorizonMs: {horizon} position: {pos} "
            f"{ts_name}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
            f"compresscodec: {h.compression.name.lower()} crc: {h.crc} "
            f"isvalid: {str(valid).lower()}",
            file=out,
        )
        if not valid:
            problems += 1
        elif deep:
            try:
                _, records = decode_batch(data, pos, verify_crc=False)
            except CorruptRecordError as exc:
                print(f"| cannot decode records: {exc}", file=out)
                problems += 1
            else:
                for r in records:
                    if last_offset != -1 and r.offset != last_offset + 1 and gaps is not None:
                        gaps.append((last_offset, r.offset))
                    last_offset = r.offset
                    print(_record_line(h, r, ts_name, print_data, decoder, skip_metadata),
                          file=out)
        pos += h.size
    return problems


INDEX_KINDS = (".index", ".timeindex", ".txnindex", ".snapshot")


def dump_files(paths: list[str], print_data: bool, decoder: str | None = None,
               deep: bool = False, skip_metadata: bool = False, sanity_only: bool = False,
               verify_only: bool = False) -> int:
    """``decoder``: "transaction-log" or "offsets" (implies ``print_data``)."""
    problems = 0
    gaps: dict[str, list[tuple[int, int]]] = {}
    mismatches: dict[str, list[tuple[int, int]]] = {}
    for path in paths:
        if not os.path.isfile(path):
            what = "a directory, not a segment file" if os.path.isdir(path) else "no such file"
            print(f"oncelog dump-log: {path}: {what}", file=sys.stderr)
            return 2
        name = path.removesuffix(".cleaned").removesuffix(".swap")
        if name.endswith(INDEX_KINDS):
            problems += dump_index(path, sanity_only=sanity_only, verify_only=verify_only,
                                   mismatches=mismatches)
        else:
            problems += dump_segment(path, print_data or decoder is not None, decoder=decoder,
                                     deep=deep, skip_metadata=skip_metadata,
                                     gaps=gaps.setdefault(os.path.abspath(path), []))
    for path, found in mismatches.items():  # Kafka's wording
        print(f"Mismatches in :{path}", file=sys.stderr)
        for index_offset, log_offset in found:
            print(f"  Index offset: {index_offset}, log offset: {log_offset}", file=sys.stderr)
    problems += len(mismatches)
    for path, pairs in gaps.items():
        if pairs:
            print(f"Non-consecutive offsets in {path}", file=sys.stderr)
            for first, second in pairs:
                print(f"  {first} is followed by {second}", file=sys.stderr)
    return 1 if problems else 0

"""The ``__transaction_state`` record, in Kafka's own layout (TransactionLogKey /
TransactionLogValue version 0): one record per transactional id, the latest one wins, a null
value (a tombstone) forgets an expired id.

    key   => version int16 (0), transactional_id string
    value => version int16 (0), producer_id int64, producer_epoch int16,
             transaction_timeout_ms int32, transaction_status int8,
             transaction_partitions [topic string, partition_ids [int32]] (null when Empty),
             transaction_last_update_timestamp_ms int64, transaction_start_timestamp_ms int64

Strings are int16-length-prefixed UTF-8, arrays int32-count-prefixed (-1: null).

Value version 1 (KIP-915/KIP-890, written once the broker's transaction.version is 1 or more)
is the same list in the flexible encoding (compact strings and arrays, unsigned-varint lengths
+ 1, tagged fields after each struct), with tagged fields after the last one:

    tag 0  PrevProducerId int64            (Kafka)  the id the client held before the bump
    tag 1  NextProducerId int64            (Kafka)  the id the client uses next
    tag 2  ClientTransactionVersion int16  (Kafka)
    tag 3  NextProducerEpoch int16         (KIP-939)
    tag 4  PrevProducerEpoch int16         (oncelog's own: Kafka derives it; a reader that
                                            does not know it skips it)
"""

from __future__ import annotations

import struct

from ..primitives import INT16 as _H
from ..primitives import INT32 as _I
from ..primitives import INT64 as _Q
from ..primitives import (
    DecodeError,
    encode_compact_string,
    encode_string,
    encode_uvarint,
    read_compact_string,
    read_string,
    read_uvarint,
)
from .state import TransactionMetadata, TransactionState

KEY_VERSION = 0
VALUE_VERSION = 0
FLEXIBLE_VALUE_VERSION = 1
_VALUE_HEAD = struct.Struct(">hqhib")
_VALUE_TAIL = struct.Struct(">qq")


class TxnLogFormatError(ValueError):
    pass


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    s, pos = read_string(buf, pos)
    if s is None:
        raise TxnLogFormatError("a null string")
    return s, pos


def encode_key(transactional_id: str) -> bytes:
    return _H.pack(KEY_VERSION) + encode_string(transactional_id)


def decode_key(data: bytes) -> str:
    try:
        (version,) = _H.unpack_from(data, 0)
        if version != KEY_VERSION:
            raise TxnLogFormatError(f"unknown transaction log key version {version}")
        txn_id, pos = _read_string(data, 2)
    except (struct.error, DecodeError) as exc:
        raise TxnLogFormatError(f"bad transaction log key: {exc}") from exc
    if pos != len(data):
        raise TxnLogFormatError("trailing bytes in transaction log key")
    return txn_id


def encode_value(m: TransactionMetadata, version: int = VALUE_VERSION) -> bytes:
    if version == FLEXIBLE_VALUE_VERSION:
        return _encode_value_v1(m)
    out = bytearray(_VALUE_HEAD.pack(VALUE_VERSION, m.producer_id, m.producer_epoch,
                                     m.txn_timeout_ms, m.state.id))
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(m.partitions):
        by_topic.setdefault(topic, []).append(partition)
    out += _I.pack(-1 if _null_partitions(m) else len(by_topic))
    for topic, parts in by_topic.items():
        out += encode_string(topic) + _I.pack(len(parts))
        out += b"".join(_I.pack(p) for p in parts)
    out += _VALUE_TAIL.pack(m.txn_last_update_ms, m.txn_start_ms)
    return bytes(out)


def _null_partitions(m: TransactionMetadata) -> bool:
    """Kafka's TransactionLog writes an Empty transaction's partitions as a null array (an
    empty one in every other state)."""
    return m.state is TransactionState.EMPTY and not m.partitions


def decode_value(transactional_id: str, data: bytes) -> TransactionMetadata:
    if len(data) >= 2 and _H.unpack_from(data, 0)[0] == FLEXIBLE_VALUE_VERSION:
        return _decode_value_v1(transactional_id, data)
    try:
        version, pid, epoch, timeout, state_id = _VALUE_HEAD.unpack_from(data, 0)
        if version != VALUE_VERSION:
            raise TxnLogFormatError(f"unknown transaction log value version {version}")
        pos = _VALUE_HEAD.size
        (topics,) = _I.unpack_from(data, pos)
        pos += 4
        partitions: set[tuple[str, int]] = set()
        for _ in range(max(topics, 0)):
            topic, pos = _read_string(data, pos)
            (n,) = _I.unpack_from(data, pos)
            pos += 4
            for _p in range(max(n, 0)):
                partitions.add((topic, _I.unpack_from(data, pos)[0]))
                pos += 4
        last_update, start = _VALUE_TAIL.unpack_from(data, pos)
        pos += _VALUE_TAIL.size
        state = TransactionState.from_id(state_id)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise TxnLogFormatError(f"bad transaction log value: {exc}") from exc
    if pos != len(data):
        raise TxnLogFormatError("trailing bytes in transaction log value")
    return TransactionMetadata(transactional_id, pid, epoch, timeout, state,
                               frozenset(partitions), start, last_update)


# -- version 1: the flexible encoding ------------------------------------------------------------

_TAGGED_INT64 = {0: "last_producer_id", 1: "next_producer_id"}
_TAGGED_INT16 = {2: "client_txn_version", 3: "next_producer_epoch", 4: "last_producer_epoch"}
_TAG_DEFAULTS = {"last_producer_id": -1, "next_producer_id": -1, "client_txn_version": 0,
                 "next_producer_epoch": -1, "last_producer_epoch": -1}


def _encode_value_v1(m: TransactionMetadata) -> bytes:
    out = bytearray(_VALUE_HEAD.pack(FLEXIBLE_VALUE_VERSION, m.producer_id, m.producer_epoch,
                                     m.txn_timeout_ms, m.state.id))
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(m.partitions):
        by_topic.setdefault(topic, []).append(partition)
    out += encode_uvarint(0 if _null_partitions(m) else len(by_topic) + 1)
    for topic, parts in by_topic.items():
        out += encode_compact_string(topic) + encode_uvarint(len(parts) + 1)
        out += b"".join(_I.pack(p) for p in parts)
        out += encode_uvarint(0)  # the struct's tagged fields: none
    out += _VALUE_TAIL.pack(m.txn_last_update_ms, m.txn_start_ms)
    tags: list[tuple[int, bytes]] = []
    for tag, name in sorted({**_TAGGED_INT64, **_TAGGED_INT16}.items()):
        value = getattr(m, name)
        if value != _TAG_DEFAULTS[name]:
            packed = _Q.pack(value) if tag in _TAGGED_INT64 else _H.pack(value)
            tags.append((tag, packed))
    out += encode_uvarint(len(tags))
    for tag, packed in tags:
        out += encode_uvarint(tag) + encode_uvarint(len(packed)) + packed
    return bytes(out)


def _decode_value_v1(transactional_id: str, data: bytes) -> TransactionMetadata:
    try:
        _version, pid, epoch, timeout, state_id = _VALUE_HEAD.unpack_from(data, 0)
        pos = _VALUE_HEAD.size
        n, pos = read_uvarint(data, pos)
        partitions: set[tuple[str, int]] = set()
        for _ in range(max(n - 1, 0)):
            topic, pos = read_compact_string(data, pos)
            count, pos = read_uvarint(data, pos)
            for _p in range(max(count - 1, 0)):
                partitions.add((topic, _I.unpack_from(data, pos)[0]))
                pos += 4
            pos = _skip_tags(data, pos, {})
        last_update, start = _VALUE_TAIL.unpack_from(data, pos)
        pos += _VALUE_TAIL.size
        fields: dict[str, int] = dict(_TAG_DEFAULTS)
        pos = _skip_tags(data, pos, fields)
        state = TransactionState.from_id(state_id)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise TxnLogFormatError(f"bad transaction log value: {exc}") from exc
    if pos != len(data):
        raise TxnLogFormatError("trailing bytes in transaction log value")
    return TransactionMetadata(transactional_id, pid, epoch, timeout, state,
                               frozenset(partitions), start, last_update, **fields)


def _skip_tags(data: bytes, pos: int, fields: dict[str, int]) -> int:
    """Read a tagged-field section: the known tags into ``fields``, the others skipped."""
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        tag, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        if pos + size > len(data):
            raise TxnLogFormatError("tagged field runs past the record")
        if tag in _TAGGED_INT64 and size == 8:
            fields[_TAGGED_INT64[tag]] = _Q.unpack_from(data, pos)[0]
        elif tag in _TAGGED_INT16 and size == 2:
            fields[_TAGGED_INT16[tag]] = _H.unpack_from(data, pos)[0]
        pos += size
    return pos

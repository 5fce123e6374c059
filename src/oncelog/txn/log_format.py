"""The ``__transaction_state`` record, in Kafka's own layout (TransactionLogKey /
TransactionLogValue version 0): one record per transactional id, the latest one wins, a null
value (a tombstone) forgets an expired id.

    key   => version int16 (0), transactional_id string
    value => version int16 (0), producer_id int64, producer_epoch int16,
             transaction_timeout_ms int32, transaction_status int8,
             transaction_partitions [topic string, partition_ids [int32]] (nullable),
             transaction_last_update_timestamp_ms int64, transaction_start_timestamp_ms int64

Strings are int16-length-prefixed UTF-8, arrays int32-count-prefixed (-1: null).
"""

from __future__ import annotations

import struct

from .state import TransactionMetadata, TransactionState

KEY_VERSION = 0
VALUE_VERSION = 0
_H = struct.Struct(">h")
_I = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqhib")
_VALUE_TAIL = struct.Struct(">qq")


class TxnLogFormatError(ValueError):
    pass


def _string(s: str) -> bytes:
    data = s.encode()
    return _H.pack(len(data)) + data


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _H.unpack_from(buf, pos)
    pos += 2
    if n < 0 or pos + n > len(buf):
        raise TxnLogFormatError("bad string length")
    return buf[pos:pos + n].decode(), pos + n


def encode_key(transactional_id: str) -> bytes:
    return _H.pack(KEY_VERSION) + _string(transactional_id)


def decode_key(data: bytes) -> str:
    try:
        (version,) = _H.unpack_from(data, 0)
        if version != KEY_VERSION:
            raise TxnLogFormatError(f"unknown transaction log key version {version}")
        txn_id, pos = _read_string(data, 2)
    except (struct.error, UnicodeDecodeError) as exc:
        raise TxnLogFormatError(f"bad transaction log key: {exc}") from exc
    if pos != len(data):
        raise TxnLogFormatError("trailing bytes in transaction log key")
    return txn_id


def encode_value(m: TransactionMetadata) -> bytes:
    out = bytearray(_VALUE_HEAD.pack(VALUE_VERSION, m.producer_id, m.producer_epoch,
                                     m.txn_timeout_ms, m.state.id))
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(m.partitions):
        by_topic.setdefault(topic, []).append(partition)
    out += _I.pack(len(by_topic))
    for topic, parts in by_topic.items():
        out += _string(topic) + _I.pack(len(parts))
        out += b"".join(_I.pack(p) for p in parts)
    out += _VALUE_TAIL.pack(m.txn_last_update_ms, m.txn_start_ms)
    return bytes(out)


def decode_value(transactional_id: str, data: bytes) -> TransactionMetadata:
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

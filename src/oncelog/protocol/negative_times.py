"""Negative timestamps that Kafka writes where kio reads only non-negative ones.

DescribeTransactions answers ``transaction_start_time_ms = -1`` for a transactional id with no
transaction begun (Empty, or just after InitProducerId). Kafka's Admin reads that as "none";
kio's reader refuses any negative datetime_i64, so our client could not read Kafka's answer. Before
kio reads a DescribeTransactionsResponse, its -1 start times become 0 (the Admin's "none":
``TransactionDescription.start_ms`` None), by walking the response's fields.
"""

from __future__ import annotations

import struct

from ..primitives import read_uvarint

_I64 = struct.Struct(">q")


def _skip_compact_string(buf, pos: int) -> int:
    n, pos = read_uvarint(buf, pos)
    return pos + max(n - 1, 0)


def _skip_tagged_fields(buf, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
    return pos


def describe_transactions_start_times(frame, pos: int):
    """``frame`` with every negative start time of the DescribeTransactions v0 response body at
    ``pos`` set to 0 (a copy; the frame itself when none is negative or the body is short)."""
    try:
        out = None
        pos += 4  # throttle_time_ms
        n, pos = read_uvarint(frame, pos)
        for _ in range(max(n - 1, 0)):
            pos += 2  # error_code
            pos = _skip_compact_string(frame, pos)  # transactional_id
            pos = _skip_compact_string(frame, pos)  # transaction_state
            pos += 4  # transaction_timeout_ms
            (start,) = _I64.unpack_from(frame, pos)
            if start < 0:
                if out is None:
                    out = bytearray(frame)
                _I64.pack_into(out, pos, 0)
            pos += 8 + 8 + 2  # start time, producer_id, producer_epoch
            topics, pos = read_uvarint(frame, pos)
            for _ in range(max(topics - 1, 0)):
                pos = _skip_compact_string(frame, pos)
                parts, pos = read_uvarint(frame, pos)
                pos += 4 * max(parts - 1, 0)
                pos = _skip_tagged_fields(frame, pos)
            pos = _skip_tagged_fields(frame, pos)
        return frame if out is None else bytes(out)
    except (struct.error, IndexError, ValueError):
        return frame  # malformed: kio's reader says so

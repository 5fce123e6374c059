"""DescribeTransactions v0 responses read by hand when kio refuses them.

Kafka answers -1 as the start time of a transaction that is not open (a transactional id in
state Empty), and kio's reader refuses a negative datetime ("Cannot parse negative
timestamp"), so our admin client could not describe such an id on a Kafka broker (found by
the differential test, oncelog.harness.differential). This reader takes the same bytes and
gives the same kio entity, with no start time (None) where Kafka sent a negative one.

Layout (flexible, v0): throttle_time_ms int32, transaction_states compact array of
{error_code int16, transactional_id compact string, transaction_state compact string,
transaction_timeout_ms int32, transaction_start_time_ms int64, producer_id int64,
producer_epoch int16, topics compact array of {topic compact string, partitions compact
array of int32, tags}, tags}, tags.
"""

from __future__ import annotations

import struct
from typing import Any

from kio.schema.describe_transactions.v0 import response as v0

from ..primitives import DecodeError, read_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_STATE = struct.Struct(">iqqh")


class _Reader:
    def __init__(self, buf: Any, pos: int) -> None:
        self.buf = memoryview(buf)
        self.pos = pos

    def fixed(self, s: struct.Struct) -> Any:
        if self.pos + s.size > len(self.buf):
            raise DecodeError("DescribeTransactions response truncated")
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values if len(values) > 1 else values[0]

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos)
        return int(value)

    def count(self) -> int:
        n = self.uvarint() - 1
        if n > len(self.buf) - self.pos:
            raise DecodeError(f"an array of {n} in {len(self.buf) - self.pos} bytes")
        return n

    def string(self) -> str:
        n = self.count()
        if n < 0:
            raise DecodeError("a null string where the schema has none")
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode()

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()
        if self.pos > len(self.buf):
            raise DecodeError("a tagged field past the end")


def read_describe_transactions(buf: Any, pos: int) -> Any:
    """The DescribeTransactionsResponse v0 body at ``pos`` (after the response header)."""
    from . import make

    r = _Reader(buf, pos)
    throttle = r.fixed(_I32)
    states = []
    for _ in range(r.count()):
        error = r.fixed(_I16)
        txn_id = r.string()
        state = r.string()
        timeout, start, producer_id, epoch = r.fixed(_STATE)
        topics = []
        for _ in range(r.count()):
            name = r.string()
            partitions = tuple(r.fixed(_I32) for _ in range(r.count()))
            r.tags()
            topics.append(make(v0.TopicData, topic=name, partitions=partitions))
        r.tags()
        states.append(make(v0.TransactionState, error_code=error, transactional_id=txn_id,
                           transaction_state=state, transaction_timeout=timeout,
                           transaction_start_time=start, producer_id=producer_id,
                           producer_epoch=epoch, topics=tuple(topics)))
    r.tags()
    if r.pos != len(r.buf):
        raise DecodeError(f"{len(r.buf) - r.pos} bytes after the DescribeTransactions body")
    return make(v0.DescribeTransactionsResponse, throttle_time=throttle,
                transaction_states=tuple(states))

"""A Produce request read by hand: each partition's record set a view of the received frame.

kio's reader made objects per topic and partition and copied every record set into bytes of its
own, and the bounds check before it walked the request once more: together about a tenth of the
broker's CPU per megabyte produced, and a copy of every byte. This reader checks each length
against what the frame holds before it is trusted, skips tagged fields, and hands the handler
the fields it reads (``transactional_id``, ``acks``, ``timeout`` as a timedelta, and
``topic_data[].name / .partition_data[].index / .records``) with record sets as read-only
memoryviews of the frame. Produce v3-v12 as Kafka's ProduceRequest.json lays them out;
tests/test_produce_request_reader.py holds it to kio's reading for every version and to the
bounds of any truncation.
"""

from __future__ import annotations

import datetime as _dt
import struct
from typing import Any

from ..primitives import DecodeError, read_uvarint

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


class ProduceRequestError(ValueError):
    pass


class PartitionProduceData:
    __slots__ = ("index", "records")

    def __init__(self, index: int, records: Any) -> None:
        self.index = index
        self.records = records


class TopicProduceData:
    __slots__ = ("name", "partition_data")

    def __init__(self, name: str, partition_data: tuple[PartitionProduceData, ...]) -> None:
        self.name = name
        self.partition_data = partition_data


class ProduceRequest:
    __slots__ = ("acks", "timeout", "topic_data", "transactional_id")

    def __init__(self, transactional_id: str | None, acks: int, timeout: _dt.timedelta,
                 topic_data: tuple[TopicProduceData, ...]) -> None:
        self.transactional_id = transactional_id
        self.acks = acks
        self.timeout = timeout
        self.topic_data = topic_data


def _need(frame: Any, pos: int, n: int, what: str) -> None:
    if n < 0 or pos + n > len(frame):
        raise ProduceRequestError(f"{what}: {n} bytes at {pos} in a frame of {len(frame)}")


def _uvarint(frame: Any, pos: int, what: str) -> tuple[int, int]:
    try:
        return read_uvarint(frame, pos)
    except DecodeError as exc:
        raise ProduceRequestError(f"{what}: {exc}") from None


def _length(frame: Any, pos: int, flexible: bool, fixed: struct.Struct, what: str
            ) -> tuple[int, int]:
    """A length or count: a compact one (unsigned varint, plus one) in flexible versions,
    else ``fixed`` (int16 for strings, int32 for arrays and bytes); -1 is null."""
    if flexible:
        n, pos = _uvarint(frame, pos, what)
        return n - 1, pos
    _need(frame, pos, fixed.size, what)
    return fixed.unpack_from(frame, pos)[0], pos + fixed.size


def _string(frame: Any, pos: int, flexible: bool, nullable: bool, what: str
            ) -> tuple[str | None, int]:
    n, pos = _length(frame, pos, flexible, _I16, what)
    if n < 0:
        if n == -1 and nullable:
            return None, pos
        raise ProduceRequestError(f"{what}: length {n}")
    _need(frame, pos, n, what)
    try:
        return bytes(frame[pos:pos + n]).decode(), pos + n
    except UnicodeDecodeError as exc:
        raise ProduceRequestError(f"{what}: {exc}") from None


def _count(frame: Any, pos: int, flexible: bool, least: int, what: str) -> tuple[int, int]:
    """An array's element count, each element at least ``least`` bytes (so that a count the
    frame cannot hold is refused before anything is made for it)."""
    n, pos = _length(frame, pos, flexible, _I32, what)
    if n < 0 or n * least > len(frame) - pos:
        raise ProduceRequestError(f"{what}: {n} elements in {len(frame) - pos} bytes")
    return n, pos


def _skip_tags(frame: Any, pos: int) -> int:
    count, pos = _uvarint(frame, pos, "tagged fields")
    for _ in range(count):
        _tag, pos = _uvarint(frame, pos, "tag")
        size, pos = _uvarint(frame, pos, "tag size")
        _need(frame, pos, size, "tagged field")
        pos += size
    return pos


def read_produce_request(version: int, frame: Any, pos: int) -> ProduceRequest:
    """The request body at ``pos`` of ``frame`` (bytes or a buffer); ProduceRequestError for
    anything the frame does not hold. Trailing bytes are ignored, as Kafka's parser does."""
    if not 3 <= version <= 12:
        raise ProduceRequestError(f"Produce v{version} is not read by hand")
    flexible = version >= 9
    view = memoryview(frame).toreadonly()
    txn_id, pos = _string(view, pos, flexible, True, "transactional_id")
    _need(view, pos, 6, "acks and timeout")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(view, pos)
    pos += 6
    topics: list[TopicProduceData] = []
    n_topics, pos = _count(view, pos, flexible, 2 if flexible else 6, "topic_data")
    for _ in range(n_topics):
        name, pos = _string(view, pos, flexible, False, "topic name")
        partitions: list[PartitionProduceData] = []
        n_parts, pos = _count(view, pos, flexible, 5 if flexible else 8, "partition_data")
        for _ in range(n_parts):
            _need(view, pos, 4, "partition index")
            (index,) = _I32.unpack_from(view, pos)
            pos += 4
            size, pos = _length(view, pos, flexible, _I32, "records")
            records: Any = None
            if size >= 0:
                _need(view, pos, size, "records")
                records = view[pos:pos + size]
                pos += size
            elif size != -1:
                raise ProduceRequestError(f"records: length {size}")
            if flexible:
                pos = _skip_tags(view, pos)
            partitions.append(PartitionProduceData(index, records))
        if flexible:
            pos = _skip_tags(view, pos)
        topics.append(TopicProduceData(name, tuple(partitions)))  # type: ignore[arg-type]
    if flexible:
        _skip_tags(view, pos)
    return ProduceRequest(txn_id, acks, _dt.timedelta(milliseconds=timeout_ms), tuple(topics))

"""The Fetch response, read by hand: each partition's record set stays a view of the received
frame.

kio reads a Fetch response into dataclasses and copies every partition's record set into a
bytes object of its own: the whole response once more. This reads Kafka's FetchResponse
(v4-v17: v7 added the session, v12 made it flexible, v13 names topics by id) into small tuples
whose ``records`` are memoryviews of the frame, so that a consumer's bytes are copied once,
from the frame into its columns. Every length is checked against the frame before it is
used: a broker's lie is a ProtocolError, as from kio. Tagged fields (diverging epoch, current
leader, snapshot id, node endpoints) are skipped: the fetcher uses none of them.
``tests/test_client_fetch_response.py`` checks it against kio's reading, version by version.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any, NamedTuple

from ..primitives import DecodeError, read_uvarint
from . import ProtocolError

MIN_VERSION = 4
MAX_VERSION = 17
FIRST_FLEXIBLE = 12
FIRST_TOPIC_ID = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ihqq")  # partition index, error code, high watermark, LSO
_I64 = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_SESSION = struct.Struct(">hi")  # error code, session id


class FetchedPartition(NamedTuple):
    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int  # -1 before v5
    aborted_transactions: list[tuple[int, int]] | None  # (first offset, producer id)
    records: memoryview | None


class FetchedTopic(NamedTuple):
    topic: str | None  # up to v12
    topic_id: uuid.UUID | None  # v13+
    partitions: list[FetchedPartition]


class FetchResponse(NamedTuple):
    throttle_time_ms: int
    error_code: int  # 0 before v7
    session_id: int
    responses: list[FetchedTopic]


class _Reader:
    __slots__ = ("buf", "end", "flexible", "pos")

    def __init__(self, buf: memoryview, pos: int, flexible: bool) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.flexible = flexible

    def need(self, n: int) -> int:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise ProtocolError(f"Fetch response truncated at byte {pos} (needs {n} more)")
        self.pos = pos + n
        return pos

    def unpack(self, s: struct.Struct) -> tuple[Any, ...]:
        return s.unpack_from(self.buf, self.need(s.size))

    def uvarint(self) -> int:
        try:
            value, self.pos = read_uvarint(self.buf, self.pos)
        except DecodeError as exc:
            raise ProtocolError(f"Fetch response: {exc}") from None
        return value

    def length(self, nullable: bool = False) -> int:
        """An array's or string's length: -1 for null (allowed only where ``nullable``)."""
        if self.flexible:
            n = self.uvarint() - 1
        else:
            (n,) = self.unpack(_I32)
        if n < -1 or (n == -1 and not nullable):
            raise ProtocolError(f"Fetch response: length {n} at byte {self.pos}")
        return n

    def string(self) -> str:
        if self.flexible:
            n = self.length()
        else:
            (n,) = self.unpack(_I16)
            if n < 0:
                raise ProtocolError(f"Fetch response: a topic name of length {n}")
        start = self.need(n)
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"Fetch response: a topic name that is not UTF-8: {exc}") \
                from None

    def skip_tagged_fields(self) -> None:
        if self.flexible:
            for _ in range(self.uvarint()):
                self.uvarint()  # tag
                self.need(self.uvarint())


def decode_fetch_response(version: int, frame: bytes | memoryview) -> tuple[int, FetchResponse]:
    """(correlation id, response) of a Fetch response frame of ``version`` (size prefix
    stripped). Raises ProtocolError if it is malformed."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ProtocolError(f"Fetch v{version}: read by hand for v{MIN_VERSION}-v{MAX_VERSION}")
    buf = frame if isinstance(frame, memoryview) else memoryview(frame)
    flexible = version >= FIRST_FLEXIBLE
    r = _Reader(buf, 0, flexible)
    (correlation_id,) = r.unpack(_I32)
    r.skip_tagged_fields()  # the response header's (v1 header: flexible versions)
    (throttle,) = r.unpack(_I32)
    error_code, session_id = r.unpack(_SESSION) if version >= 7 else (0, 0)
    by_id = version >= FIRST_TOPIC_ID
    topics = []
    for _ in range(r.length()):
        name: str | None = None
        topic_id: uuid.UUID | None = None
        if by_id:
            start = r.need(16)
            topic_id = uuid.UUID(bytes=bytes(buf[start : start + 16]))
        else:
            name = r.string()
        partitions = []
        for _ in range(r.length()):
            index, code, high_watermark, lso = r.unpack(_HEAD)
            log_start = r.unpack(_I64)[0] if version >= 5 else -1
            aborted: list[tuple[int, int]] | None = None
            count = r.length(nullable=True)
            if count >= 0:
                aborted = []
                for _ in range(count):
                    producer_id, first_offset = r.unpack(_ABORTED)
                    aborted.append((first_offset, producer_id))
                    r.skip_tagged_fields()
            if version >= 11:
                r.need(4)  # preferred read replica
            size = r.length(nullable=True)
            records = None
            if size >= 0:
                start = r.need(size)
                records = buf[start : start + size]
            r.skip_tagged_fields()
            partitions.append(FetchedPartition(index, code, high_watermark, lso, log_start,
                                               aborted, records))
        r.skip_tagged_fields()
        topics.append(FetchedTopic(name, topic_id, partitions))
    r.skip_tagged_fields()
    return correlation_id, FetchResponse(throttle, error_code, session_id, topics)

"""Kafka's framing and correlation, sans-IO: bytes in, frames out, bytes to write.

Every Kafka message on a connection is an ``int32 size`` followed by that many bytes. The
caller owns the socket (a blocking one, an asyncio transport, a stream) and feeds whatever it
read to ``receive_data``; ``next_event`` then hands back one complete frame (size prefix
stripped) at a time, or ``NEED_DATA`` until more bytes arrive, as h11's Connection does for
HTTP. Nothing here does IO, so the same code splits frames in the broker's network layer, our
client, inter-broker calls and the verify proxy.

``Framing`` is the server's side: it refuses a frame whose size is negative or over
``max_frame_size`` as soon as the four size bytes are in, before the body is buffered (Kafka's
socket.request.max.bytes; sasl.server.max.receive.size before authentication).

``ClientFraming`` is a requester's side. Kafka answers one connection's requests strictly in
order, so it keeps the requests in flight in a queue and matches each response to the oldest:
a response whose correlation id is not that one's means the stream is out of step, and
``next_event`` raises ``CorrelationError`` (the Java client's "Correlation id for response does
not match request"); the caller closes the connection.

Buffers: received chunks are kept as they came, in a list, with a read position in the first;
a complete frame is copied out of them once (a slice of one chunk, or one join across several).
Appending every chunk to one growing ``bytearray`` instead copied a large frame two or three
times more (each realloc moves what is buffered), which a 1 MB produce request pays per request.
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any, Final, Generic, TypeVar

from . import ProtocolError, encode_request

_SIZE = struct.Struct(">i")
INT32_MAX: Final = 0x7FFFFFFF
_SMALL_READ = 4096  # reads below this are gathered in Framing's tail buffer
_TAIL_MAX = 1 << 16  # ... until it holds this much

C = TypeVar("C")


class NeedData:
    """``next_event``'s answer while no complete frame is buffered."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


class FrameSizeError(ProtocolError):
    """A frame whose size prefix is outside ``min_size..max_size``; the connection is done."""

    def __init__(self, size: int, min_size: int, max_size: int) -> None:
        super().__init__(f"frame size {size} outside {min_size}..{max_size}")
        self.size = size
        self.min_size = min_size
        self.max_size = max_size


class CorrelationError(ProtocolError):
    """A response that is not the answer to the oldest request in flight: ``expected`` is that
    request's correlation id, or None when nothing was in flight."""

    def __init__(self, received: int, expected: int | None) -> None:
        if expected is None:
            message = f"unexpected response (correlation id {received}): nothing in flight"
        else:
            message = (f"correlation id {received} does not match the oldest request in "
                       f"flight ({expected})")
        super().__init__(message)
        self.received = received
        self.expected = expected


class Framing:
    """One connection's incoming frames, split and size-checked; and frames to write."""

    __slots__ = ("_buffered", "_chunks", "_pos", "_tail", "max_frame_size", "min_frame_size")

    def __init__(self, max_frame_size: int = INT32_MAX, min_frame_size: int = 0) -> None:
        self._chunks: deque[bytes] = deque()  # received, not yet returned
        self._pos = 0  # where the unread bytes of _chunks[0] start
        # Small reads gathered into one buffer, moved to _chunks when a frame needs them: a
        # client trickling bytes cannot make each byte cost an object.
        self._tail = bytearray()
        self._buffered = 0  # unread bytes in _chunks and _tail
        self.max_frame_size = max_frame_size
        self.min_frame_size = min_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame (a partial frame, or frames not
        asked for yet)."""
        return self._buffered

    def receive_data(self, data: bytes) -> None:
        n = len(data)
        if n >= _SMALL_READ and type(data) is bytes:
            self._flush_tail()
            self._chunks.append(data)
        elif n:
            tail = self._tail
            tail += data  # (also copies a caller's reusable buffer: frames are bytes)
            if len(tail) >= _TAIL_MAX:
                self._flush_tail()
        self._buffered += n

    def _flush_tail(self) -> None:
        if self._tail:
            self._chunks.append(bytes(self._tail))
            self._tail.clear()

    def clear(self) -> None:
        """Forget what was received (the connection is closed; a new one starts afresh)."""
        self._chunks.clear()
        self._tail.clear()
        self._pos = 0
        self._buffered = 0

    def next_size(self) -> int | None:
        """The size prefix of the next frame once its four bytes are in, unchecked; else
        None. (The broker reserves that much of queued.max.request.bytes before reading on.)"""
        if self._buffered < 4:
            return None
        if self._buffered - len(self._tail) < 4:
            self._flush_tail()
        if len(self._chunks[0]) - self._pos < 4:
            self._merge_front(4)
        return int(_SIZE.unpack_from(self._chunks[0], self._pos)[0])

    def next_event(self) -> bytes | NeedData:
        """The next complete frame, without its size prefix; else NEED_DATA. Raises
        FrameSizeError as soon as a size prefix is out of bounds."""
        if self._buffered < 4:
            return NEED_DATA
        chunks = self._chunks
        if self._buffered - len(self._tail) < 4:
            self._flush_tail()
        if len(chunks[0]) - self._pos < 4:  # the size prefix spans chunks: join the first few
            self._merge_front(4)
        first, pos = chunks[0], self._pos
        (size,) = _SIZE.unpack_from(first, pos)
        if size < self.min_frame_size or size > self.max_frame_size:
            raise FrameSizeError(size, self.min_frame_size, self.max_frame_size)
        end = 4 + size
        if self._buffered < end:
            return NEED_DATA
        if self._buffered - len(self._tail) < end:
            self._flush_tail()
        self._buffered -= end
        if len(first) - pos >= end:  # within the first chunk
            frame = first[pos + 4:pos + end]  # the one copy
            if pos + end == len(first):
                chunks.popleft()
                self._pos = 0
            else:
                self._pos = pos + end
            return frame
        parts: list[Any] = [memoryview(first)[pos + 4:]]
        left = end - (len(first) - pos)
        chunks.popleft()
        while left > len(chunks[0]):
            chunk = chunks.popleft()
            parts.append(chunk)
            left -= len(chunk)
        if left == len(chunks[0]):
            parts.append(chunks.popleft())
            self._pos = 0
        else:
            parts.append(memoryview(chunks[0])[:left])
            self._pos = left
        return b"".join(parts)  # the one copy

    def _merge_front(self, n: int) -> None:
        """Make the first chunk hold at least ``n`` unread bytes (``n`` <= the bytes in
        _chunks)."""
        chunks = self._chunks
        parts = [chunks.popleft()[self._pos:]]
        have = len(parts[0])
        while have < n:
            chunk = chunks.popleft()
            parts.append(chunk)
            have += len(chunk)
        chunks.appendleft(b"".join(parts))
        self._pos = 0

    @staticmethod
    def send(frame: bytes) -> bytes:
        """``frame`` with its size prefix: the bytes to write."""
        return _SIZE.pack(len(frame)) + frame


class ClientFraming(Generic[C]):
    """The requesting side of a connection: requests out under increasing correlation ids,
    responses in, each paired with the ``context`` its request was sent with."""

    __slots__ = ("_next_correlation_id", "client_id", "frames", "in_flight")

    def __init__(self, client_id: str | None, *, first_correlation_id: int = 0,
                 max_frame_size: int = INT32_MAX, min_frame_size: int = 4) -> None:
        self.client_id = client_id
        # A response is at least its correlation id.
        self.frames = Framing(max_frame_size, min_frame_size)
        self.in_flight: deque[tuple[int, C]] = deque()  # (correlation id, context), oldest first
        self._next_correlation_id = first_correlation_id

    def new_correlation_id(self) -> int:
        """The correlation id of the next request (wrapping within an int32, as Kafka's)."""
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & INT32_MAX
        return correlation_id

    def send(self, correlation_id: int, request: Any, context: C, *,
             expect_response: bool = True) -> bytes:
        """The bytes of ``request`` (a kio request entity) under ``correlation_id``; when a
        response is expected, it is awaited after every request already in flight."""
        data = encode_request(correlation_id, self.client_id, request)
        if expect_response:
            self.in_flight.append((correlation_id, context))
        return data

    def expect(self, correlation_id: int, context: C) -> None:
        """Await a response to a request whose bytes someone else encoded (the verify proxy
        forwards its clients' frames as they are)."""
        self.in_flight.append((correlation_id, context))

    def receive_data(self, data: bytes) -> None:
        self.frames.receive_data(data)

    def next_event(self) -> tuple[C, bytes] | NeedData:
        """The next response as (its request's context, the frame without size prefix), the
        request no longer in flight; else NEED_DATA. Raises FrameSizeError, ProtocolError (a
        frame too short for a correlation id) or CorrelationError."""
        frame = self.frames.next_event()
        if not isinstance(frame, bytes):
            return NEED_DATA
        return self.match(frame), frame

    def match(self, frame: Any) -> C:
        """The context of the request ``frame`` answers (a response without its size prefix,
        from ``next_event`` or split by the caller itself), no longer in flight. Raises
        ProtocolError (too short for a correlation id) or CorrelationError."""
        if len(frame) < 4:
            raise ProtocolError("response truncated")
        (correlation_id,) = _SIZE.unpack_from(frame, 0)
        if not self.in_flight:
            raise CorrelationError(correlation_id, None)
        expected, context = self.in_flight[0]
        if correlation_id != expected:
            raise CorrelationError(correlation_id, expected)
        self.in_flight.popleft()
        return context

    def clear(self) -> list[C]:
        """Forget the buffered bytes and every request in flight (the connection is closed);
        return their contexts, oldest first, for the caller to fail."""
        self.frames.clear()
        contexts = [context for _, context in self.in_flight]
        self.in_flight.clear()
        return contexts

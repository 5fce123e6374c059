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

Buffers: received bytes are appended to one ``bytearray``; a frame is copied out of it once,
through a ``memoryview``, and its bytes are deleted from the front (cheap on a bytearray).
"""

from __future__ import annotations

import struct
from collections import deque
from typing import Any, Final, Generic, TypeVar

from . import ProtocolError, encode_request

_SIZE = struct.Struct(">i")
INT32_MAX: Final = 0x7FFFFFFF

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

    __slots__ = ("_buf", "max_frame_size", "min_frame_size")

    def __init__(self, max_frame_size: int = INT32_MAX, min_frame_size: int = 0) -> None:
        self._buf = bytearray()
        # Public and mutable: the broker lowers the limit until a connection authenticates.
        self.max_frame_size = max_frame_size
        self.min_frame_size = min_frame_size

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as a frame (a partial frame, or frames not
        asked for yet)."""
        return len(self._buf)

    def receive_data(self, data: bytes) -> None:
        self._buf += data

    def clear(self) -> None:
        """Forget what was received (the connection is closed; a new one starts afresh)."""
        self._buf.clear()

    def next_event(self) -> bytes | NeedData:
        """The next complete frame, without its size prefix; else NEED_DATA. Raises
        FrameSizeError as soon as a size prefix is out of bounds."""
        buf = self._buf
        if len(buf) < 4:
            return NEED_DATA
        (size,) = _SIZE.unpack_from(buf, 0)
        if size < self.min_frame_size or size > self.max_frame_size:
            raise FrameSizeError(size, self.min_frame_size, self.max_frame_size)
        end = 4 + size
        if len(buf) < end:
            return NEED_DATA
        frame = bytes(memoryview(buf)[4:end])  # the one copy (the view is released at once)
        del buf[:end]
        return frame

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
        if len(frame) < 4:
            raise ProtocolError("response truncated")
        (correlation_id,) = _SIZE.unpack_from(frame, 0)
        if not self.in_flight:
            raise CorrelationError(correlation_id, None)
        expected, context = self.in_flight[0]
        if correlation_id != expected:
            raise CorrelationError(correlation_id, expected)
        self.in_flight.popleft()
        return context, frame

    def clear(self) -> list[C]:
        """Forget the buffered bytes and every request in flight (the connection is closed);
        return their contexts, oldest first, for the caller to fail."""
        self.frames.clear()
        contexts = [context for _, context in self.in_flight]
        self.in_flight.clear()
        return contexts

"""The follower's Fetch on the wire: its requests encoded here, its responses read straight into
a buffer and parsed in place.

A follower fetches the same few partitions from its leader over and over (Kafka's
ReplicaFetcherThread), and every byte it fetches goes to its log unchanged. So the fetcher's
connection (``FetcherConnection``, an ``asyncio.BufferedProtocol``) lets the socket write each
response frame into a buffer of its own, and ``parse_fetch_response`` hands back each
partition's record set as a memoryview of that buffer: the log checks the batches (framing,
CRC, offsets) and writes those bytes to its segment. One copy out of the kernel, one into the
page cache, none in between (a bytes object per read, a join into the frame, a slice into
kio's response object, as a general connection does). The request, a fixed shape with a few
numbers that change, is encoded directly rather than built as kio objects.

The shapes are Fetch v12 (KIP-516's topic ids come with v13; v12 names topics, as the
follower's replicas know them), request header v2 and response header v1, both flexible:
compact strings and arrays, tagged fields (none sent; any received are skipped).

One request is in flight on a connection at a time, and the buffer behind a response is reused
for the next: the caller is done with a response (and every memoryview of it) before it sends
its next request, as the fetcher loop is.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
from typing import Any, NamedTuple

from ..primitives import encode_uvarint
from ..protocol import ProtocolError, decode_response, encode_request
from ..protocol.fetch_reader import decode_fetch_response
from .interbroker import MAX_RESPONSE_BYTES, ChannelError

FETCH_KEY = 1
FETCH_VERSION = 12

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")  # api key, version, correlation id
_REQUEST_FIXED = struct.Struct(">iiiibii")  # replica, max wait, min/max bytes, isolation, session
_PARTITION = struct.Struct(">iiqiqi")  # partition, leader epoch, offset, last epoch, start, max
_READ_AHEAD = 1 << 16  # read between frames: a small response in one recv, with its size


class FetchPartition(NamedTuple):
    """One partition of a follower's Fetch request."""

    partition: int
    current_leader_epoch: int
    fetch_offset: int
    log_start_offset: int
    max_bytes: int


class FetchedPartition(NamedTuple):
    """One partition of a Fetch response: ``records`` is a view of the response's buffer
    (None when the leader sent none)."""

    topic: str
    partition: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: memoryview | None


def encode_fetch_request(correlation_id: int, client_id: str, replica_id: int,
                         max_wait_ms: int, min_bytes: int, max_bytes: int,
                         topics: list[tuple[str, list[FetchPartition]]]) -> bytes:
    """A sessionless Fetch v12 request frame (size prefix included) from follower
    ``replica_id``: read_uncommitted, no rack, no forgotten topics."""
    client = client_id.encode()
    parts = [b"", _HEADER.pack(FETCH_KEY, FETCH_VERSION, correlation_id),
             struct.pack(">h", len(client)), client, b"\x00",  # no tagged fields
             _REQUEST_FIXED.pack(replica_id, max_wait_ms, min_bytes, max_bytes, 0, 0, -1),
             encode_uvarint(len(topics) + 1)]
    for topic, partitions in topics:
        name = topic.encode()
        parts += (encode_uvarint(len(name) + 1), name, encode_uvarint(len(partitions) + 1))
        for p in partitions:
            parts += (_PARTITION.pack(p.partition, p.current_leader_epoch, p.fetch_offset, -1,
                                      p.log_start_offset, p.max_bytes), b"\x00")
        parts.append(b"\x00")
    parts.append(b"\x01\x01\x00")  # no forgotten topics, rack "", no tagged fields
    body = b"".join(parts)
    return _SIZE.pack(len(body)) + body


def parse_fetch_response(frame: memoryview) -> tuple[int, int, list[FetchedPartition]]:
    """(correlation id, top-level error code, partitions) of a Fetch v12 response frame (size
    prefix stripped), read by the consumer's reader (protocol/fetch_reader.py): record sets
    stay views of the frame. Aborted transactions are left out: a follower reads uncommitted."""
    correlation_id, response = decode_fetch_response(12, frame)
    return correlation_id, response.error_code, [
        FetchedPartition(t.topic, p.partition_index,  # type: ignore[arg-type]  # v12: named
                         p.error_code, p.high_watermark, p.log_start_offset, p.records)
        for t in response.responses for p in t.partitions]


class FetcherConnection(asyncio.BufferedProtocol):
    """A connection to one leader for the fetcher's requests, one at a time. Each response
    frame lands in ``_frame`` (kept and reused while big enough) and its waiter gets a
    memoryview of it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._head = bytearray(_READ_AHEAD)  # between frames: the size and what follows it
        self._head_len = 0
        self._frame = bytearray(0)
        self._frame_size = -1  # the frame being read, -1 between frames
        self._frame_len = 0
        self._waiter: asyncio.Future | None = None
        self._error: Exception | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame_size < 0:
            return memoryview(self._head)[self._head_len:]
        return memoryview(self._frame)[self._frame_len:self._frame_size]

    def buffer_updated(self, nbytes: int) -> None:
        if self._frame_size >= 0:
            self._frame_len += nbytes
            if self._frame_len == self._frame_size:
                self._deliver()
            return
        self._head_len += nbytes
        if self._head_len < 4:
            return
        (size,) = _SIZE.unpack_from(self._head, 0)
        if size < 4 or size > MAX_RESPONSE_BYTES:
            self._fail(ChannelError(f"the leader sent a frame of {size} bytes"))
            return
        if self._waiter is None or self._waiter.done():
            self._fail(ChannelError("a response nobody asked for"))
            return
        have = self._head_len - 4
        if have > size:
            self._fail(ChannelError("bytes past the response of the one request in flight"))
            return
        if len(self._frame) < size or len(self._frame) > 4 * max(size, _READ_AHEAD):
            self._frame = bytearray(size)  # (a small frame does not keep a huge buffer)
        self._frame[:have] = memoryview(self._head)[4:4 + have]
        self._head_len = 0
        self._frame_size, self._frame_len = size, have
        if have == size:
            self._deliver()

    def _deliver(self) -> None:
        # Read-only: nothing downstream may write into the buffer (and kio reads only such).
        view = memoryview(self._frame).toreadonly()[:self._frame_size]
        self._frame_size, self._frame_len = -1, 0
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(view)

    def _fail(self, exc: Exception) -> None:
        self._error = exc
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ChannelError(f"connection to the leader closed: {exc!r}"))

    async def request(self, frame: bytes, timeout_s: float) -> memoryview:
        """Send one request frame and return its response frame (size prefix stripped)."""
        if self.lost or self.transport is None or self.transport.is_closing():
            raise ChannelError("connection to the leader lost")
        if self._waiter is not None:
            raise ChannelError("a request is in flight already")
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self.transport.write(frame)
        timer = loop.call_later(timeout_s, self._timed_out, waiter, timeout_s)
        try:
            return await waiter
        finally:
            timer.cancel()
            if not waiter.done():  # the caller was cancelled: the answer is not for anyone
                self._fail(ChannelError("request abandoned"))

    async def call(self, correlation_id: int, client_id: str, request: Any,
                   timeout_s: float) -> Any:
        """One request given as a kio entity (the SASL login's, before the first Fetch) and
        its decoded response."""
        cls: Any = type(request)
        frame = await self.request(encode_request(correlation_id, client_id, request),
                                   timeout_s)
        try:
            got, response = decode_response(cls.__api_key__, cls.__version__, frame)
        except ProtocolError as exc:
            self._fail(ChannelError(str(exc)))
            raise ChannelError(str(exc)) from None
        if got != correlation_id:
            self._fail(ChannelError("a response out of step with the request"))
            raise ChannelError(f"correlation id {got} answers request {correlation_id}")
        return response

    def _timed_out(self, waiter: asyncio.Future, timeout_s: float) -> None:
        if waiter is self._waiter and not waiter.done():
            self._fail(ChannelError(f"the leader did not answer within {timeout_s:.1f} s"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(host: str, port: int, timeout_s: float = 5.0,
                  ssl_context: ssl.SSLContext | None = None, login: Any = None,
                  node_id: int = -1, client_id: str = "") -> FetcherConnection:
    """A connection to the leader ``node_id`` at host:port (over TLS with ``ssl_context``),
    logged in with ``login`` (an interbroker_sasl.InterBrokerLogin) between SASL brokers."""
    if login is not None:
        login.check(node_id)  # a login refused a moment ago: not again yet
    loop = asyncio.get_running_loop()
    try:
        _, protocol = await asyncio.wait_for(
            loop.create_connection(FetcherConnection, host, port, ssl=ssl_context,
                                   server_hostname=host if ssl_context else None), timeout_s)
    except (TimeoutError, OSError) as exc:
        raise ChannelError(f"cannot connect to {host}:{port}: {exc!r}") from None
    if protocol.lost:
        raise ChannelError(f"connection to {host}:{port} closed at once")
    if login is not None:
        correlation_ids = iter(range(1, 1 << 31))

        async def call(request: Any) -> Any:
            return await protocol.call(next(correlation_ids), client_id, request, timeout_s)

        try:
            await login.authenticate(node_id, call)
        except ChannelError:
            protocol.close()
            raise
    return protocol

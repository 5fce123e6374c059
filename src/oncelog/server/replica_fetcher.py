"""The follower's side of replication: ``ReplicaFetcherManager``, a fetcher per leader broker
(truncation by leader epoch, then fetches appended to the followed partitions' logs), and its
Fetch on the wire: its requests encoded here, its responses read straight into a buffer and
parsed in place.

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
import logging
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from ..primitives import encode_uvarint
from ..protocol import ApiKey, ProtocolError, decode_response, encode_request, make, request_module
from ..protocol.fetch_reader import decode_fetch_response
from .clock import now_ms
from .interbroker import MAX_RESPONSE_BYTES, ChannelError, InterBrokerClient
from .partition import TP, Partition

log = logging.getLogger("oncelog.replication")

EPOCH_VERSION = 4  # OffsetForLeaderEpoch
BACKOFF_S = 0.2

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


class ReplicaFetcherManager:
    """The follower's side (Kafka's ReplicaFetcherManager and its fetcher threads): a fetcher
    task per leader broker that first truncates each followed partition's log where it
    diverges from the leader's (OffsetForLeaderEpoch), then fetches from its log end offset,
    appends the leader's batches unchanged (log/log.py rebuilds producer state, transactions
    and the aborted-transaction index from them) and takes min(leader's high watermark, its
    own log end) as high watermark."""

    def __init__(self, node_id: int, partitions: dict[TP, Partition], *,
                 address_of: Callable[[int], tuple[str, int] | None],
                 client: InterBrokerClient, ssl_context: ssl.SSLContext | None, login: Any,
                 fetch_wait_ms: int, fetch_max_bytes: int) -> None:
        self.node_id = node_id
        self.partitions = partitions  # the replica manager's map, read as it changes
        self._address_of = address_of
        self.client = client
        self.ssl_context = ssl_context
        self.login = login
        self.fetch_wait_ms = fetch_wait_ms
        self.fetch_max_bytes = fetch_max_bytes
        self._fetchers: dict[int, asyncio.Task] = {}
        # leader -> the fetcher's connection to it and the address it was opened to
        self._fetch_connections: dict[int, tuple[FetcherConnection, tuple[str, int]]] = {}
        self._correlation_id = 0
        self._wake_fetchers: dict[int, asyncio.Event] = {}

    def close(self) -> None:
        for t in self._fetchers.values():
            t.cancel()
        for leader in list(self._fetch_connections):
            self._close_fetch_connection(leader)

    def sync(self) -> None:
        """One fetcher per leader of the partitions this broker follows (after a new view)."""
        leaders = {r.leader for r in self.partitions.values()
                   if not r.is_leader and r.leader >= 0 and r.leader != self.node_id}
        for leader in list(self._fetchers):
            if leader not in leaders:
                self._fetchers.pop(leader).cancel()
                self._wake_fetchers.pop(leader, None)
                self._close_fetch_connection(leader)
        for leader in leaders:
            task = self._fetchers.get(leader)
            if task is None or task.done():
                self._wake_fetchers[leader] = asyncio.Event()
                self._fetchers[leader] = asyncio.get_running_loop().create_task(
                    self._fetch_from(leader))
            else:
                self._wake_fetchers[leader].set()

    def _following(self, leader: int) -> list[Partition]:
        return [r for r in self.partitions.values()
                if not r.is_leader and r.leader == leader]

    async def _fetch_from(self, leader: int) -> None:
        while True:
            try:
                replicas = self._following(leader)
                if not replicas:
                    return
                todo = [r for r in replicas if r.needs_truncation]
                if todo:
                    await self._truncate(leader, todo)
                ready = [r for r in replicas if not r.needs_truncation]
                if ready:
                    await self._fetch(leader, ready)
                else:
                    await asyncio.sleep(BACKOFF_S)
            except asyncio.CancelledError:
                raise
            except ChannelError as exc:
                log.debug("fetching from broker %d: %s", leader, exc)
                await self._backoff(leader)
            except Exception:
                log.exception("replica fetcher for broker %d failed; retrying", leader)
                await self._backoff(leader)

    async def _backoff(self, leader: int) -> None:
        event = self._wake_fetchers.get(leader)
        if event is None:
            await asyncio.sleep(BACKOFF_S)
            return
        event.clear()
        try:
            await asyncio.wait_for(event.wait(), BACKOFF_S)
        except TimeoutError:
            pass

    async def _truncate(self, leader: int, replicas: list[Partition]) -> None:
        """Kafka's truncation by leader epoch: ask the leader for the end offset of our latest
        epoch, cut our log there (or at our own end of the epoch the leader answers with)."""
        mod = request_module(ApiKey.OFFSET_FOR_LEADER_EPOCH, EPOCH_VERSION)
        by_topic: dict[str, list] = {}
        asked: dict[TP, tuple[Partition, int]] = {}
        for r in replicas:
            latest = r.log.leader_epoch_cache.latest_epoch
            epoch = -1 if latest is None else latest
            asked[r.tp] = (r, r.leader_epoch)
            by_topic.setdefault(r.partition.topic, []).append(make(
                mod.OffsetForLeaderPartition, partition=r.partition.index,
                current_leader_epoch=r.leader_epoch, leader_epoch=epoch))
        request = make(mod.OffsetForLeaderEpochRequest, replica_id=self.node_id,
                       topics=tuple(make(mod.OffsetForLeaderTopic, topic=t, partitions=tuple(ps))
                                    for t, ps in by_topic.items()))
        response = await self.client.request(leader, request, purpose="replication")
        for t in response.topics:
            for p in t.partitions:
                found = asked.get((t.topic, p.partition))
                if found is None:
                    continue
                r, epoch_asked = found
                if r.is_leader or r.leader_epoch != epoch_asked:
                    continue  # the view moved on meanwhile
                if p.error_code:
                    log.debug("%s-%d: OffsetForLeaderEpoch: %s", t.topic, p.partition,
                              p.error_code.name)
                    continue
                plog = r.log
                if p.end_offset < 0:
                    # The leader knows no such epoch: keep what is known to be replicated.
                    target = min(plog.high_watermark, plog.log_end_offset)
                else:
                    target = min(p.end_offset, plog.log_end_offset)
                    latest = plog.leader_epoch_cache.latest_epoch
                    if latest is not None and p.leader_epoch < latest:
                        # Our later epochs are unknown to the leader: cut at our own end of
                        # the epoch it answered with as well.
                        _e, own_end = plog.end_offset_for_epoch(p.leader_epoch)
                        if own_end >= 0:
                            target = min(target, own_end)
                if target < plog.log_end_offset:
                    log.info("%s-%d: truncating %d -> %d (leader %d, epoch %d)", *r.tp,
                             plog.log_end_offset, target, leader, r.leader_epoch)
                    plog.truncate_to(target)
                r.needs_truncation = False

    async def _fetch_connection(self, leader: int) -> FetcherConnection:
        """The fetcher's own connection to ``leader`` (replica_fetcher.py), opened on first use
        and again after it broke or the leader moved."""
        address = self._address_of(leader)
        if address is None:
            raise ChannelError(f"broker {leader} is not registered")
        found = self._fetch_connections.get(leader)
        if found is not None:
            conn, where = found
            if where == address and not conn.lost and conn.transport is not None \
                    and not conn.transport.is_closing():
                return conn
            conn.close()
            del self._fetch_connections[leader]
        conn = await connect(*address, ssl_context=self.ssl_context,
                                             login=self.login, node_id=leader,
                                             client_id=f"broker-{self.node_id}-fetcher")
        self._fetch_connections[leader] = (conn, address)
        return conn

    def _close_fetch_connection(self, leader: int) -> None:
        found = self._fetch_connections.pop(leader, None)
        if found is not None:
            found[0].close()

    async def _fetch(self, leader: int, replicas: list[Partition]) -> None:
        by_topic: dict[str, list[FetchPartition]] = {}
        asked: dict[TP, tuple[Partition, int]] = {}
        for r in replicas:
            plog = r.log
            asked[r.tp] = (r, r.leader_epoch)
            by_topic.setdefault(r.partition.topic, []).append(FetchPartition(
                r.partition.index, r.leader_epoch, plog.log_end_offset, plog.log_start_offset,
                self.fetch_max_bytes))
        self._correlation_id = correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
        request = encode_fetch_request(
            correlation_id, f"broker-{self.node_id}-fetcher", self.node_id, self.fetch_wait_ms,
            1, self.fetch_max_bytes * 4, list(by_topic.items()))
        started = time.monotonic()
        conn = await self._fetch_connection(leader)
        try:
            frame = await conn.request(request, self.fetch_wait_ms / 1000 + 30)
            answered, error_code, partitions = parse_fetch_response(frame)
            if answered != correlation_id:
                raise ChannelError(f"broker {leader} answered correlation id {answered}, not "
                                   f"{correlation_id}")
        except ChannelError:
            self._close_fetch_connection(leader)
            raise
        except ProtocolError as exc:
            self._close_fetch_connection(leader)
            raise ChannelError(f"broker {leader}: {exc}") from None
        if error_code:
            log.info("fetch from broker %d: %s", leader, ErrorCode(error_code).name)
            await self._backoff(leader)
            return
        errors = 0
        for p in partitions:
            fr = self.partitions.get((p.topic, p.partition))
            # Kafka's fetcher: only for a partition still fetched as the request did (same
            # replica, still following this leader at the epoch asked, not to be truncated).
            if fr is None or asked.get(fr.tp) != (fr, fr.leader_epoch) or fr.is_leader \
                    or fr.leader != leader or fr.needs_truncation:
                continue
            r = fr
            if p.error_code:
                errors += 1
                code = ErrorCode(p.error_code)
                if code == ErrorCode.offset_out_of_range:
                    self._out_of_range(r, p.log_start_offset)
                log.debug("%s-%d: fetch from %d: %s", *r.tp, leader, code.name)
                continue
            plog = r.log
            if p.records:
                plog.append_as_follower(p.records)
            plog.update_high_watermark(min(p.high_watermark, plog.log_end_offset))
            # Kafka's follower: the leader's log start offset, as its answer says.
            if p.log_start_offset > plog.log_start_offset:
                plog.increment_log_start_offset(
                    min(p.log_start_offset, plog.high_watermark), now_ms())
        del frame, partitions  # the connection's buffer is reused for the next response
        if errors and time.monotonic() - started < BACKOFF_S:
            await self._backoff(leader)

    def _out_of_range(self, r: Partition, leader_log_start: int) -> None:
        """Kafka's handleOutOfRangeError: a follower whose log ends below the leader's log
        start (the leader deleted records it had not fetched yet) starts again, empty, at
        the leader's log start; otherwise its log ends past the leader's: truncate by epoch."""
        plog = r.log
        if 0 <= leader_log_start and plog.log_end_offset < leader_log_start:
            log.info("%s-%d: log end %d below the leader's log start %d: starting there",
                     *r.tp, plog.log_end_offset, leader_log_start)
            plog.truncate_fully_and_start_at(leader_log_start, now_ms())
        else:
            r.needs_truncation = True

"""The network edge: an asyncio TCP server moving Kafka frames to and from the Broker.

Each connection splits its byte stream into ``int32 size`` frames and hands them, in order, to
one task that answers them one after another, as Kafka does (a connection is muted while its
request is in progress), so responses always come back in request order. A long-poll fetch
therefore delays only its own connection. Anything a client does wrong (oversized or negative
frame sizes, garbage, unknown APIs) closes that one connection; the broker goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import socket
import time

from ..protocol.framing import FrameSizeError, Framing
from ..records.region import FileRegion
from ..security.tls import server_ssl_context
from .broker import Broker
from .console import ConsoleServer, start_http_server
from .context import CloseConnection
from .metrics import Sample

log = logging.getLogger("oncelog.network")

# The errors of a socket whose peer has gone (besides ConnectionError's subclasses).
_PEER_GONE = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN,
                        errno.ECONNABORTED})
STREAM_CHUNK = 256 * 1024  # record-set bytes read from a segment file at a time (no sendfile)


def _set_once(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: BrokerServer, counted: bool = False) -> None:
        self.server = server
        self.counted = counted  # a TLS connection: counted in at accept, before its handshake
        self.broker = server.broker
        config = self.broker.config
        self.max_frame = config.int("socket.request.max.bytes")
        self.max_unauthenticated_frame = config.int("sasl.server.max.receive.size")
        self.framing = Framing(self.max_frame)
        self.frame: bytes | None = None  # the one request in flight (Kafka mutes the channel)
        self.frame_ready = asyncio.Event()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.peer = "?"
        self.ip = "?"
        self.task: asyncio.Task | None = None
        self.reading_paused = False
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.closed = False
        self.session = self.broker.new_session()
        self.last_active = time.monotonic()
        self.partial_since: float | None = None  # when the frame being read began to arrive
        self.socket_fd = -1  # the connection's descriptor, for sendfile (-1: none to use)
        self.zero_copy = False
        self.sendfile_waiter: asyncio.Future | None = None
        self.reserved = 0  # bytes of queued.max.request.bytes held for the frame being read

    # -- asyncio.Protocol callbacks -----------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        sock = transport.get_extra_info("socket")
        # sendfile only on a plain socket: on a TLS connection it would put the segment's
        # bytes on the wire unencrypted, under the TLS stream; those take _write_chunks.
        tls = self.server.ssl_context is not None or \
            transport.get_extra_info("sslcontext") is not None
        if sock is not None and not tls:
            self.socket_fd = sock.fileno()
            self.zero_copy = self.socket_fd >= 0
            # can_write set exactly when the transport holds nothing: a record set sent by
            # sendfile must not overtake bytes still queued in front of it.
            transport.set_write_buffer_limits(high=0, low=0)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.ip = peer[0] if peer else "?"
        refused = self.server.admit(self)
        self.counted = False  # in self.server.connections now, or refused
        if refused is None and self.broker.security.principal_from_certificate:
            refused = self._certificate_principal(transport)
        if refused:
            log.warning("closing %s: %s", self.peer, refused)
            self.closed = True
            transport.close()
            return
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def _certificate_principal(self, transport) -> str | None:
        """An SSL listener's client is its certificate's principal (None: it is set), or the
        reason it is refused (no ssl.principal.mapping.rules rule applies)."""
        ssl_object = transport.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        try:
            self.session.principal = self.broker.security.certificate_principal(der)
        except ValueError as exc:
            self.server.release(self)
            return f"client certificate refused: {exc}"
        return None

    def data_received(self, data: bytes) -> None:
        self.framing.receive_data(data)
        self.last_active = time.monotonic()
        if self.frame is None:
            self._take_frame()
        elif not self.reading_paused:  # a request is in flight: read no further
            self.reading_paused = True
            self.transport.pause_reading()

    def _take_frame(self) -> None:
        """Move the next complete frame out of the buffer, then stop reading until it is
        answered: one request in flight per connection, as Kafka's SocketServer mutes a
        channel, so a client cannot make the broker hold more than one request of its own (a
        long poll with large frames pipelined behind it held 1.4 GB)."""
        framing = self.framing
        framing.max_frame_size = self.max_frame if self.session.authenticated \
            else min(self.max_frame, self.max_unauthenticated_frame)
        if not self.reserved and self.server.queued_max > 0:
            size = framing.next_size()
            if size is not None and 0 <= size <= framing.max_frame_size and \
                    not self.server.reserve(self, size + 4):
                # queued.max.request.bytes reached: read nothing more until it has room
                self.partial_since = None
                if not self.reading_paused:
                    self.reading_paused = True
                    self.transport.pause_reading()
                return
        try:
            frame = framing.next_event()
        except FrameSizeError as exc:
            setting = "socket.request.max.bytes" if self.session.authenticated \
                else "sasl.server.max.receive.size, before authentication"
            log.warning("closing %s: frame size %d outside 0..%d (%s)", self.peer, exc.size,
                        exc.max_size, setting)
            self._close()
            return
        if isinstance(frame, bytes):  # else NEED_DATA
            self.frame = frame
            self.partial_since = None  # no read deadline while the request is served
            self.frame_ready.set()
            if not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()
            return
        if framing.buffered and self.partial_since is None:
            self.partial_since = time.monotonic()
        elif not framing.buffered:
            self.partial_since = None
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.release(self)
        self.server.unreserve(self)
        self.can_write.set()
        if self.sendfile_waiter is not None:
            _set_once(self.sendfile_waiter)
        if self.task is not None:
            self.task.cancel()

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.can_write.set()

    # -- request loop -------------------------------------------------------------------------

    async def _serve(self) -> None:
        try:
            while not self.closed:
                if self.frame is None:
                    self.frame_ready.clear()
                    await self.frame_ready.wait()
                    continue
                frame = self.frame
                try:
                    response = await self.broker.handle_frame(frame, self.peer, self.session)
                except CloseConnection as exc:
                    log.warning("closing %s: %s", self.peer, exc)
                    self._close()
                    return
                except Exception:
                    log.exception("closing %s: request failed unexpectedly", self.peer)
                    self._close()
                    return
                if response is not None and not self.closed:
                    await self._write(response)
                if self.session.close_after_response:  # e.g. a failed SASL authentication
                    self._close()
                    return
                self.last_active = time.monotonic()
                self.partial_since = self.last_active if self.framing.buffered else None
                self.frame = None
                self.server.unreserve(self)
                if not self.closed:
                    self._take_frame()  # the next request, already read, or read on
        except asyncio.CancelledError:
            pass

    async def _write(self, parts: list) -> None:
        """Write a response: bytes parts through the transport (one writev, record sets
        uncopied), record sets left in segment files (FileRegion) straight from the file to
        the socket with sendfile, as Kafka's FileRecords.writeTo does, so their bytes never
        enter the broker's memory however large the response or slow its reader. Where the
        socket is no plain one (no descriptor to send to), a region goes a chunk at a time,
        each once the client has drained the last."""
        regions = [p for p in parts if type(p) is FileRegion]
        try:
            if not regions:
                self.transport.writelines(parts)
            else:
                pending: list[bytes] = []
                for part in parts:
                    if type(part) is not FileRegion:
                        pending.append(part)
                        continue
                    if pending:
                        self.transport.writelines(pending)
                        pending = []
                    if self.closed:
                        return
                    if self.zero_copy:
                        await self._sendfile(part)
                    else:
                        await self._write_chunks(part)
                if pending:
                    self.transport.writelines(pending)
            if not self.can_write.is_set():
                await self.can_write.wait()
        except OSError as exc:  # the segment lost bytes under us, or the peer went away
            if not self.closed:
                # A client that hangs up mid-fetch (reset, broken pipe) is routine: DEBUG, as
                # Kafka logs a peer's disconnection; a segment that failed us is a WARNING.
                gone = isinstance(exc, ConnectionError) or exc.errno in _PEER_GONE
                log.log(logging.DEBUG if gone else logging.WARNING,
                        "closing %s: a fetched record set could not be sent: %s", self.peer,
                        exc)
            self._close()
        finally:
            for region in regions:
                region.close()

    async def _write_chunks(self, region: FileRegion) -> None:
        for chunk in region.chunks(STREAM_CHUNK):
            if self.closed:
                return
            self.transport.write(chunk)
            if not self.can_write.is_set():
                await self.can_write.wait()

    async def _sendfile(self, region: FileRegion) -> None:
        """``region`` from its file to the socket by sendfile(2), after what the transport
        holds (the write buffer's low and high marks are 0, so ``can_write`` is set exactly
        when it is empty). The socket is non-blocking: when it is full, wait until it takes
        more, watching a duplicate of its descriptor (the transport's own is the loop's to
        watch). The duplicate lives only while this region is sent, so it never keeps a
        closed connection's socket open."""
        if not self.can_write.is_set():
            await self.can_write.wait()
        if self.closed:
            return
        loop = asyncio.get_running_loop()
        out = os.dup(self.socket_fd)
        try:
            position, left = region.position, region.length
            while left:
                if self.closed:
                    return
                try:
                    sent = os.sendfile(out, region.fd, position, left)
                except BlockingIOError:
                    await self._writable(loop, out)
                    continue
                if sent == 0:
                    raise OSError(f"segment shorter than the region "
                                  f"({region.length - left} of {region.length})")
                position += sent
                left -= sent
        finally:
            os.close(out)

    async def _writable(self, loop: asyncio.AbstractEventLoop, fd: int) -> None:
        ready = loop.create_future()
        self.sendfile_waiter = ready
        loop.add_writer(fd, _set_once, ready)
        try:
            await ready
        finally:
            loop.remove_writer(fd)
            self.sendfile_waiter = None

    def _close(self) -> None:
        self.closed = True
        if self.sendfile_waiter is not None:
            _set_once(self.sendfile_waiter)
        if self.transport is not None:
            self.transport.close()


class BrokerServer:
    def __init__(self, broker: Broker, host: str = "127.0.0.1", port: int = 9092) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.connections: set[KafkaConnection] = set()
        self.per_ip: dict[str, int] = {}
        self.handshakes = 0  # TLS connections accepted and counted in, their handshake under way
        # queued.max.request.bytes: the bytes of requests being read or served (Kafka's
        # MemoryPool), the connections waiting for room, and the most ever held
        self.queued_max = broker.config.int("queued.max.request.bytes")
        self.queued_bytes = 0
        self.queued_peak = 0
        self.waiting: collections.deque[KafkaConnection] = collections.deque()
        broker.stats.add_source(self._samples)
        self._listener: socket.socket | None = None
        self._acceptor: asyncio.Task | None = None
        self._handshaking: set[asyncio.Task] = set()
        config = broker.config
        self.idle_ms = config.int("connections.max.idle.ms")
        self.read_timeout_ms = config.int("socket.request.read.timeout.ms")
        self._sweeper: asyncio.Task | None = None
        self._server: asyncio.base_events.Server | None = None
        self.metrics_port: int | None = None  # where the metrics page is served, if it is
        self.http: ConsoleServer | None = None  # the HTTP server of both ports, if one is set
        # SSL and SASL_SSL listeners (security/tls.py); a bad setting fails here, at startup
        self.ssl_context = server_ssl_context(config)
        self.console: ConsoleServer | None = None  # the web console, when console.port is set

    # -- connection limits ---------------------------------------------------------------------

    @property
    def max_connections(self) -> int:
        return self.broker.config.int("max.connections")  # dynamic (KIP-226): read each time

    @property
    def max_per_ip(self) -> int:
        return self.broker.config.int("max.connections.per.ip")

    # -- queued.max.request.bytes ---------------------------------------------------------------

    def reserve(self, conn: KafkaConnection, size: int) -> bool:
        """Hold ``size`` bytes for the request ``conn`` is about to read, or queue ``conn``
        until there is room: Kafka's SimpleMemoryPool, which lends to any reader while some
        memory is left (a request larger than the rest still goes through) and mutes the
        others; reading resumes as requests are answered."""
        if self.queued_bytes >= self.queued_max:
            if conn not in self.waiting:
                self.waiting.append(conn)
            return False
        self.queued_bytes += size
        self.queued_peak = max(self.queued_peak, self.queued_bytes)
        conn.reserved = size
        return True

    def unreserve(self, conn: KafkaConnection) -> None:
        if conn.reserved:
            self.queued_bytes -= conn.reserved
            conn.reserved = 0
        if conn.closed:
            with contextlib.suppress(ValueError):
                self.waiting.remove(conn)
        while self.waiting and self.queued_bytes < self.queued_max:
            other = self.waiting.popleft()
            if not other.closed and other.frame is None:
                other._take_frame()

    def _samples(self):
        yield Sample("oncelog_queued_request_bytes", "bytes of requests read or being read and "
                     "not yet answered (bounded by queued.max.request.bytes)", self.queued_bytes)
        yield Sample("oncelog_queued_request_bytes_max", "the most bytes of requests ever "
                     "queued at once", self.queued_peak)

    def _refusal(self, ip: str) -> str | None:
        if len(self.connections) + self.handshakes >= self.max_connections:
            return f"max.connections ({self.max_connections}) reached"
        if self.per_ip.get(ip, 0) >= self.max_per_ip:
            return f"max.connections.per.ip ({self.max_per_ip}) reached for {ip}"
        return None

    def _count_ip(self, ip: str, delta: int) -> None:
        left = self.per_ip.get(ip, 0) + delta
        if left:
            self.per_ip[ip] = left
        else:
            del self.per_ip[ip]

    def admit(self, conn: KafkaConnection) -> str | None:
        """Count a new connection in, or say why it is refused: ``max.connections`` and
        ``max.connections.per.ip`` (Kafka closes a connection over its IP's quota at once).
        A TLS connection was counted at accept (``_accept_tls``): it only moves from the
        handshakes to the connections."""
        if conn.counted:
            self.handshakes -= 1
        else:
            refused = self._refusal(conn.ip)
            if refused:
                return refused
            self._count_ip(conn.ip, 1)
        self.connections.add(conn)
        self.broker.stats.connections_created += 1
        return None

    @property
    def max_pending_handshakes(self) -> int:
        """TLS handshakes under way at once: half of ``max.connections`` (at least one), so
        connections that never finish theirs hold at most half the broker's slots, each for
        at most socket.request.read.timeout.ms (oncelog's; Kafka bounds them only by
        max.connections)."""
        return max(1, self.max_connections // 2)

    async def _accept_tls(self, listener: socket.socket) -> None:
        """The accept loop of a TLS listener: each connection is counted against
        ``max.connections`` and ``max.connections.per.ip`` as it is accepted, before its
        handshake, as Kafka's SocketServer counts it before its SslTransportLayer
        handshakes: one over a limit (or over the pending handshakes') is closed at once,
        holding its descriptor no longer than that."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: try again in a moment
                log.warning("accepting a connection failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            ip = address[0]
            refused = self._refusal(ip)
            if refused is None and self.handshakes >= self.max_pending_handshakes:
                refused = f"{self.handshakes} TLS handshakes under way (half of max.connections)"
            if refused:
                log.warning("closing %s:%s: %s", ip, address[1], refused)
                sock.close()
                continue
            self.handshakes += 1
            self._count_ip(ip, 1)
            task = loop.create_task(self._handshake(sock, ip))
            self._handshaking.add(task)
            task.add_done_callback(self._handshaking.discard)

    async def _handshake(self, sock: socket.socket, ip: str) -> None:
        """The TLS handshake of a counted connection, within socket.request.read.timeout.ms;
        then it is a KafkaConnection (whose connection_made moves it from the handshakes to
        the connections). A failed one gives its place back."""
        made: list[KafkaConnection] = []

        def connection() -> KafkaConnection:
            made.append(KafkaConnection(self, counted=True))
            return made[0]

        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                connection, sock, ssl=self.ssl_context,
                ssl_handshake_timeout=self.read_timeout_ms / 1000)
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001  (timeout, alert, reset)
            log.info("closing %s: TLS handshake failed: %s", ip, exc or type(exc).__name__)
            sock.close()
        finally:
            if not made or made[0].counted:  # never made: its place is given back
                self.handshakes -= 1
                self._count_ip(ip, -1)

    def release(self, conn: KafkaConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.broker.stats.connections_closed += 1
            self._count_ip(conn.ip, -1)

    async def _sweep_forever(self) -> None:
        """Close connections idle past ``connections.max.idle.ms`` (Kafka's), and those whose
        request has been arriving for longer than ``socket.request.read.timeout.ms`` (ours: a
        client sending a byte a second held its connection for ever). Neither counts while a
        request of the connection is being served."""
        interval = max(0.01, min(self.idle_ms, self.read_timeout_ms) / 4000)
        while True:
            await asyncio.sleep(min(interval, 1.0))
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.frame is not None or conn.closed:
                    continue
                if conn.partial_since is not None and \
                        (now - conn.partial_since) * 1000 > self.read_timeout_ms:
                    log.warning("closing %s: a request still incomplete after %d ms "
                                "(socket.request.read.timeout.ms)", conn.peer,
                                self.read_timeout_ms)
                    conn._close()
                elif (now - conn.last_active) * 1000 > self.idle_ms:
                    log.info("closing %s: idle for %d ms (connections.max.idle.ms)",
                             conn.peer, self.idle_ms)
                    conn._close()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.ssl_context is None:
            self._server = await loop.create_server(
                lambda: KafkaConnection(self), self.host, self.port, reuse_address=True,
                backlog=512)
            self.port = self._server.sockets[0].getsockname()[1]
        else:  # TLS: counted at accept, then the handshake (_accept_tls)
            family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
            self._listener = socket.create_server((self.host, self.port), family=family,
                                                  backlog=512)
            self._listener.setblocking(False)
            self.port = self._listener.getsockname()[1]
            self._acceptor = loop.create_task(self._accept_tls(self._listener))
        self.broker.host = self.host
        self.broker.port = self.port
        await self.broker.join_cluster()
        # one HTTP server for the console's port and the metrics port, over HTTPS with the
        # listener's own context when it is SSL or SASL_SSL
        self.http = await start_http_server(
            self.broker, self.host, self.broker.config.int("console.port"),
            self.broker.config.int("metrics.port"), ssl_context=self.ssl_context)
        if self.http is not None:
            self.metrics_port = self.http.metrics_port
            self.console = self.http if self.http.port is not None else None
        self.broker.stats.start_loop_monitor()
        self.broker.start_maintenance()
        self._sweeper = loop.create_task(self._sweep_forever())

    async def stop(self) -> None:
        """Stop accepting, drop the connections, then shut the broker down cleanly."""
        if self._server is not None:
            self._server.close()
        if self._acceptor is not None:
            self._acceptor.cancel()
        if self._listener is not None:
            self._listener.close()
        for task in list(self._handshaking):
            task.cancel()
        if self.http is not None:
            self.http.close()
        self.broker.stats.stop_loop_monitor()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn._close()
        if self._server is not None:
            await self._server.wait_closed()
        self.broker.close()
        await asyncio.sleep(0)  # let the tasks close() cancelled (replica fetchers) unwind

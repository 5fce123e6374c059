"""The network edge: an asyncio TCP server moving Kafka frames to and from the Broker.

Each connection splits its byte stream into ``int32 size`` frames and hands them, in order, to
one task that answers them one after another, as Kafka does (a connection is muted while its
request is in progress), so responses always come back in request order. A long-poll fetch
therefore delays only its own connection. Anything a client does wrong (oversized or negative
frame sizes, garbage, unknown APIs) closes that one connection; the broker goes on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from ..protocol.framing import FrameSizeError, Framing
from ..records.region import FileRegion
from ..security.tls import server_ssl_context
from .broker import Broker
from .console import ConsoleServer, start_http_server
from .context import CloseConnection

log = logging.getLogger("oncelog.network")

STREAM_CHUNK = 256 * 1024  # record-set bytes read from a segment file at a time (no sendfile)


def _set_once(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
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
        if refused:
            log.warning("closing %s: %s", self.peer, refused)
            self.closed = True
            transport.close()
            return
        self.task = asyncio.get_running_loop().create_task(self._serve())

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
                log.warning("closing %s: a fetched record set could not be sent: %s",
                            self.peer, exc)
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

    def admit(self, conn: KafkaConnection) -> str | None:
        """Count a new connection in, or say why it is refused: ``max.connections`` and
        ``max.connections.per.ip`` (Kafka closes a connection over its IP's quota at once)."""
        if len(self.connections) >= self.max_connections:
            return f"max.connections ({self.max_connections}) reached"
        if self.per_ip.get(conn.ip, 0) >= self.max_per_ip:
            return f"max.connections.per.ip ({self.max_per_ip}) reached for {conn.ip}"
        self.connections.add(conn)
        self.broker.stats.connections_created += 1
        self.per_ip[conn.ip] = self.per_ip.get(conn.ip, 0) + 1
        return None

    def release(self, conn: KafkaConnection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self.broker.stats.connections_closed += 1
            left = self.per_ip[conn.ip] - 1
            if left:
                self.per_ip[conn.ip] = left
            else:
                del self.per_ip[conn.ip]

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
        self._server = await loop.create_server(
            lambda: KafkaConnection(self), self.host, self.port, reuse_address=True, backlog=512,
            ssl=self.ssl_context,
            # a handshake is not yet a connection the sweeper sees: bound it as a request
            ssl_handshake_timeout=self.read_timeout_ms / 1000 if self.ssl_context else None)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
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

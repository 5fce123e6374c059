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
import struct
from collections import deque

from .broker import Broker, CloseConnection
from .metrics import start_metrics_server

log = logging.getLogger("oncelog.network")

_SIZE = struct.Struct(">i")
MAX_QUEUED_REQUESTS = 16  # stop reading from a client that pipelines more than this


class KafkaConnection(asyncio.Protocol):
    def __init__(self, server: BrokerServer) -> None:
        self.server = server
        self.broker = server.broker
        self.max_frame = self.broker.config.int("socket.request.max.bytes")
        self.buf = bytearray()
        self.frames: deque[bytes] = deque()
        self.frame_ready = asyncio.Event()
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set on connect
        self.peer = "?"
        self.task: asyncio.Task | None = None
        self.reading_paused = False
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.closed = False
        self.session = self.broker.new_session()

    # -- asyncio.Protocol callbacks -----------------------------------------------------------

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        while n - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0 or size > self.max_frame:
                log.warning("closing %s: frame size %d outside 0..%d (socket.request.max.bytes)",
                            self.peer, size, self.max_frame)
                self._close()
                return
            if n - pos - 4 < size:
                break
            with memoryview(buf) as mv:
                self.frames.append(bytes(mv[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
            self.frame_ready.set()
            if len(self.frames) >= MAX_QUEUED_REQUESTS and not self.reading_paused:
                self.reading_paused = True
                self.transport.pause_reading()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.can_write.set()
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
                if not self.frames:
                    self.frame_ready.clear()
                    await self.frame_ready.wait()
                    continue
                frame = self.frames.popleft()
                if self.reading_paused and len(self.frames) < MAX_QUEUED_REQUESTS // 2:
                    self.reading_paused = False
                    self.transport.resume_reading()
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
                    self.transport.writelines(response)  # one writev, record sets uncopied
                    if not self.can_write.is_set():
                        await self.can_write.wait()
                if self.session.close_after_response:  # e.g. a failed SASL authentication
                    self._close()
                    return
        except asyncio.CancelledError:
            pass

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class BrokerServer:
    def __init__(self, broker: Broker, host: str = "127.0.0.1", port: int = 9092) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.connections: set[KafkaConnection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._metrics: asyncio.base_events.Server | None = None
        self.metrics_port: int | None = None  # where the metrics page is served, if it is

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self), self.host, self.port, reuse_address=True, backlog=512
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self.broker.host = self.host
        self.broker.port = self.port
        await self.broker.join_cluster()
        metrics_port = self.broker.config.int("metrics.port")
        if metrics_port >= 0:
            self._metrics = await start_metrics_server(self.broker, self.host, metrics_port)
            self.metrics_port = self._metrics.sockets[0].getsockname()[1]
        self.broker.start_maintenance()

    async def stop(self) -> None:
        """Stop accepting, drop the connections, then shut the broker down cleanly."""
        if self._server is not None:
            self._server.close()
        if self._metrics is not None:
            self._metrics.close()
        for conn in list(self.connections):
            conn._close()
        if self._server is not None:
            await self._server.wait_closed()
        self.broker.close()
        await asyncio.sleep(0)  # let the tasks close() cancelled (replica fetchers) unwind

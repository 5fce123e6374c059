"""A TCP relay in front of a broker, to cut it off from the network (fault tests).

A broker started with ``advertised.listeners=PLAINTEXT://127.0.0.1:<relay port>`` is reached by
clients and by the other brokers only through its relay; ``cut()`` drops every connection and
refuses new ones (its ZooKeeper session is untouched: the broker lives on, alone), ``heal()``
lets traffic through again.

    with Relay("127.0.0.1", 0, "127.0.0.1", broker_port) as relay:
        ...
        relay.cut()
        relay.heal()
"""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from ..loop_thread import LoopThread


class Relay:
    def __init__(self, host: str, port: int, target_host: str, target_port: int) -> None:
        self.host = host
        self.port = port
        self.target = (target_host, target_port)
        self.is_cut = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop_thread = LoopThread(f"relay-{port}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> Self:
        self._server = self._loop_thread.start(
            asyncio.start_server(self._serve, self.host, self.port, reuse_address=True),
            timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        self.loop = self._loop_thread.loop
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.discard(writer)
        self._writers.discard(up_writer)

    def _call(self, fn) -> None:
        if self.loop is None:
            return
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait(10)

    def cut(self) -> None:
        """Drop every connection through the relay and refuse new ones."""
        def apply() -> None:
            self.is_cut = True
            for w in list(self._writers):
                w.transport.abort()
            self._writers.clear()

        self._call(apply)

    def heal(self) -> None:
        def apply() -> None:
            self.is_cut = False

        self._call(apply)

    def stop(self) -> None:
        if self.loop is None:
            return
        self.cut()

        async def close() -> None:
            if self._server is not None:
                self._server.close()

        self._loop_thread.stop(close(), timeout=10)
        self.loop = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

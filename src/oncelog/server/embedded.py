"""A broker on its own event loop in a background thread: for the demo and for tests.

    with EmbeddedBroker() as broker:
        producer = Producer(bootstrap_servers=broker.bootstrap_servers)
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Self

from ..loop_thread import LoopThread, new_event_loop
from .broker import Broker
from .config import BrokerConfig
from .network import BrokerServer


class EmbeddedBroker:
    def __init__(self, data_dir: str | Path | None = None, host: str = "127.0.0.1",
                 port: int = 0, config: dict[str, str] | None = None) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="oncelog-"))
        self.host = host
        self.port = port
        self.config = BrokerConfig(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: BrokerServer | None = None
        self._loop_thread = LoopThread("oncelog-broker", new_event_loop)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def broker(self) -> Broker:
        assert self.server is not None
        return self.server.broker

    def start(self) -> Self:
        self.server = self._loop_thread.start(self._start_server())
        self.port = self.server.port
        self.loop = self._loop_thread.loop
        return self

    async def _start_server(self) -> BrokerServer:
        broker = Broker(self.data_dir, self.config, host=self.host, port=self.port)
        server = BrokerServer(broker, self.host, self.port)
        try:
            await server.start()
        except BaseException:
            # e.g. the port is taken: free the data directory
            with contextlib.suppress(Exception):  # the first error is the one to report
                broker.close()
            raise
        return server

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the broker's loop and return its result (for tests)."""
        return self._loop_thread.call(fn, *args)

    def stop(self) -> None:
        if self.server is None or not self._loop_thread.running:
            return
        self._loop_thread.stop(self.server.stop())
        self.server = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""A broker on its own event loop in a background thread: for the demo and for tests.

    with EmbeddedBroker() as broker:
        producer = Producer(bootstrap_servers=broker.bootstrap_servers)
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Self

from .broker import Broker
from .config import BrokerConfig
from .network import BrokerServer
from .run import new_event_loop


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
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def broker(self) -> Broker:
        assert self.server is not None
        return self.server.broker

    def start(self) -> Self:
        self._thread = threading.Thread(target=self._run, name="oncelog-broker", daemon=True)
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        self.loop = new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            broker = Broker(self.data_dir, self.config, host=self.host, port=self.port)
            self.server = BrokerServer(broker, self.host, self.port)
            self.loop.run_until_complete(self.server.start())
            self.port = self.server.port
        except BaseException as exc:  # noqa: BLE001 (re-raised in the starting thread)
            self._error = exc
            if self.server is not None:  # e.g. the port is taken: free the data directory
                with contextlib.suppress(Exception):  # the first error is the one to report
                    self.server.broker.close()
                self.server = None
            self._started.set()
            return
        self._started.set()
        self.loop.run_forever()
        self.loop.close()

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the broker's loop and return its result (for tests)."""
        assert self.loop is not None

        async def _call():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(_call(), self.loop).result()

    def stop(self) -> None:
        if self.loop is None or self.server is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.server = None
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

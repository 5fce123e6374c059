"""An asyncio event loop of its own on a background thread, driven from other threads.

The embedded broker, the verify proxy and the fault-test relay each serve sockets on a loop
that the test (or demo) thread does not run; this is that loop, started, used and stopped the
same way by all three:

    thread = LoopThread("oncelog-proxy")
    server = thread.start(start_server())       # runs on the loop; its error raises here
    thread.run(some_coroutine())                # from any other thread
    thread.stop(shutdown())                     # then the loop stops and the thread ends

It sits at the bottom of the package (it imports nothing of oncelog) so that the server, the
verify proxy and the test harness can all use it without a cycle.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (the broker's), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LoopThread:
    """A daemon thread running a new event loop until ``stop``."""

    def __init__(self, name: str,
                 loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
                 ) -> None:
        self.name = name
        self._loop_factory = loop_factory
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, setup: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Start the thread and its loop, run ``setup`` on it first and return its result.

        If ``setup`` raises (a port already taken, say), the loop is closed, the thread ends
        and the error is raised here, in the starting thread.
        """
        started = threading.Event()
        outcome: list[Any] = []

        def run() -> None:
            loop = self.loop = self._loop_factory()
            asyncio.set_event_loop(loop)
            try:
                outcome.append(loop.run_until_complete(setup))
            except BaseException as exc:  # noqa: BLE001 (re-raised in the starting thread)
                outcome.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name=self.name, daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise TimeoutError(f"{self.name}: the event loop did not start within {timeout} s")
        result = outcome[0]
        if isinstance(result, BaseException):
            self._thread.join()
            self._thread = None
            raise result
        return result

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait (at most ``timeout`` s) for its result."""
        assert self.loop is not None, f"{self.name} is not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
        """Run ``fn(*args)`` on the loop (so that it sees the loop's state at rest) and return
        its result."""

        async def call() -> T:
            return fn(*args)

        return self.run(call(), timeout)

    def stop(self, shutdown: Coroutine[Any, Any, Any] | None = None,
             timeout: float | None = None) -> None:
        """Run ``shutdown`` on the loop (if given), stop the loop and join the thread."""
        thread, loop = self._thread, self.loop
        if thread is None or loop is None:
            if shutdown is not None:
                shutdown.close()  # never run: no "coroutine was never awaited" warning
            return
        if shutdown is not None:
            self.run(shutdown, timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None

"""The asyncio-loop-on-a-thread class (oncelog/loop_thread.py) shared by the embedded broker,
the verify proxy and the fault-test relay."""

from __future__ import annotations

import asyncio
import threading

import pytest

from oncelog.loop_thread import LoopThread, new_event_loop


def test_start_runs_setup_on_the_loop_and_stop_joins_the_thread():
    t = LoopThread("test-loop", new_event_loop)

    async def setup() -> str:
        return threading.current_thread().name

    assert t.start(setup()) == "test-loop"
    assert t.running

    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0)
        return a + b

    assert t.run(add(2, 3), timeout=5) == 5
    assert t.call(lambda: threading.current_thread().name, timeout=5) == "test-loop"
    stopped = []

    async def shutdown() -> None:
        stopped.append(True)

    t.stop(shutdown(), timeout=5)
    assert stopped == [True]
    assert not t.running
    assert not any(th.name == "test-loop" for th in threading.enumerate())
    assert t.loop is not None and t.loop.is_closed()
    t.stop()  # a second stop does nothing


def test_a_failing_setup_raises_in_the_starting_thread_and_ends_the_thread():
    t = LoopThread("test-failing")

    async def setup() -> None:
        raise OSError("port taken")

    with pytest.raises(OSError, match="port taken"):
        t.start(setup())
    assert not t.running
    assert t.loop is not None and t.loop.is_closed()

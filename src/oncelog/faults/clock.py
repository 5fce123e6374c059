"""Clock skew and jumps per broker: the wall clock of one broker process moved, its monotonic
clock left alone, as on a host whose clock is wrong (Jepsen's clock nemesis sets the system
clock with ``date``/``adjtime``: only CLOCK_REALTIME moves).

How: the broker runs as ``python -m oncelog.faults.clock OFFSET_FILE -m MODULE ARGS...``, where
``-m MODULE ARGS`` is the broker process's own command (``wrap_command``): before the broker's first import, ``time.time`` and ``time.time_ns``
are replaced by functions that add the offset in ``OFFSET_FILE`` (milliseconds, a float; the
file re-read at most every 50 ms of monotonic time, so a jump takes effect within 50 ms). The
broker reads its wall clock only through ``time.time()`` / ``time.time_ns()`` (record
timestamps with ``message.timestamp.type=LogAppendTime``, transaction start times and their
``transaction.timeout.ms`` expiry, retention by time, group member expiry that is timed by
wall clock, its log lines' times, the ZooKeeper client's), so all of that sees the skewed clock;
its timers (asyncio's loop, ``time.monotonic``) do not, as on a real host. Measured: a
LogAppendTime topic's append times follow the offset and its jumps (tests/test_faults_net.py);
the transaction coordinator stamps a transaction's start and checks ``transaction.timeout.ms``
against ``server/clock.py``'s ``now_ms`` (``time.time``), as Kafka's coordinator does with its
wall clock, so a coordinator whose clock jumps ahead by more than a timeout aborts the open
transactions it coordinates. ``set_offset``
moves the clock at run time: forward or back (a jump), any number of times; ``reset``
puts it right.

Why not libfaketime (Debian's faketime, LD_PRELOAD): with a fixed ``FAKETIME=+2h`` it shifts
a Python process fine, but fixed for the process's life (no jumps). Changing it at run time
needs ``FAKETIME_TIMESTAMP_FILE``, and then libfaketime fakes CLOCK_MONOTONIC as well: a jump
back stops monotonic time, and Python's ``time.sleep`` (clock_nanosleep on CLOCK_MONOTONIC,
TIMER_ABSTIME) hung; with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` the same ``time.sleep`` fails
with EINVAL (measured here with libfaketime 0.9.10). Neither is a real skewed host. What this
does not move: clock reads in C code (none in the broker) and ``datetime.now()`` (the broker
does not use it).
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

__all__ = ["ClockControl", "install", "wrap_command"]

_REREAD_NS = 50_000_000


def install(offset_file: str) -> None:
    """Make this process's ``time.time`` / ``time.time_ns`` add the offset in
    ``offset_file`` (milliseconds; a missing or unreadable file counts as 0)."""
    real_time_ns = time.time_ns
    monotonic_ns = time.monotonic_ns
    state = {"offset_ns": 0, "checked": -_REREAD_NS * 2}

    def offset_ns() -> int:
        now = monotonic_ns()
        if now - state["checked"] >= _REREAD_NS:
            state["checked"] = now
            try:
                with open(offset_file) as f:
                    state["offset_ns"] = int(float(f.read().strip() or 0) * 1_000_000)
            except (OSError, ValueError):
                pass  # being rewritten: the last offset read
        return state["offset_ns"]

    def skewed_time_ns() -> int:
        return real_time_ns() + offset_ns()

    def skewed_time() -> float:
        return skewed_time_ns() / 1e9

    time.time_ns = skewed_time_ns
    time.time = skewed_time


def wrap_command(argv: list[str], offset_file: str | os.PathLike[str]) -> list[str]:
    """A ``python ... -m MODULE ...`` command run with a skewable clock: ``-m MODULE`` becomes
    ``-m oncelog.faults.clock OFFSET_FILE -m MODULE`` (the first ``-m`` in ``argv``)."""
    i = argv.index("-m")
    return [*argv[:i], "-m", "oncelog.faults.clock", os.fspath(offset_file), *argv[i:]]


class ClockControl:
    """The offset file of one process: ``set_offset(ms)``, ``offset_ms``, ``reset()``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists():
            self.set_offset(0)

    def set_offset(self, ms: float) -> None:
        """The process's wall clock is ``ms`` milliseconds ahead of the real one (behind when
        negative) from the next read on (within 50 ms)."""
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{float(ms)}\n")
        tmp.replace(self.path)

    @property
    def offset_ms(self) -> float:
        try:
            return float(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0.0

    def reset(self) -> None:
        self.set_offset(0)


def _main() -> None:
    # python -m oncelog.faults.clock OFFSET_FILE -m MODULE ARGS...
    if len(sys.argv) < 4 or sys.argv[2] != "-m":
        sys.exit("usage: python -m oncelog.faults.clock OFFSET_FILE -m MODULE [ARGS...]")
    offset_file, module = sys.argv[1], sys.argv[3]
    install(offset_file)
    sys.argv = [module, *sys.argv[4:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()

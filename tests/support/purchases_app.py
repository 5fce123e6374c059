"""Spec 001's purchases app (src/oncelog/examples/purchases.py) as a child process, killed and
restarted by tests/test_exactly_once_app.py and tests/test_cluster_coordinators.py."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time


class App:
    """The purchases app as a child process; ``committed`` is the last count it reported."""

    def __init__(self, bootstrap: str, client: str, idle_exit: float = 8) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oncelog.examples.purchases", "--bootstrap-server",
             bootstrap, "--client", client, "--batch", "500", "--idle-exit", str(idle_exit),
             "--session-timeout-ms", "3000"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.committed = 0
        self.lines: list[str] = []
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self._buf = b""

    def _pump(self, timeout: float) -> bool:
        """Read what the app printed; False once its output has ended."""
        assert self.proc.stdout is not None
        if not self._sel.select(timeout):
            return True
        chunk = self.proc.stdout.read()
        if not chunk:
            return False
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if line.startswith("committed "):
                self.committed = int(line.split()[1])
        return True

    def wait_committed_more_than(self, n: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.committed <= n:
            assert time.monotonic() < deadline, "\n".join(self.lines[-30:])
            assert self._pump(0.2), "app exited:\n" + "\n".join(self.lines[-30:])

    def read_output(self) -> None:
        """Take in what it printed so far (its pipe never fills while a test waits)."""
        self._pump(0)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._close()

    def wait_done(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self._pump(0.2):
            assert time.monotonic() < deadline, "\n".join(self.lines[-30:])
        assert self.proc.wait(30) == 0, "\n".join(self.lines[-30:])
        self._close()

    def _close(self) -> None:
        self._sel.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()

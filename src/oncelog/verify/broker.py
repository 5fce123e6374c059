"""``oncelog broker`` as a child process that ``oncelog verify`` can SIGKILL and start again.

The first start picks a free port; restarts keep it, so the proxy's upstream address holds.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

_LISTENING = re.compile(rb"oncelog broker listening on ([\d.]+):(\d+)")


class BrokerChild:
    def __init__(self, data_dir: Path, settings: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = dict(settings or {})
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.with_name(data_dir.name + ".broker.log")

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "oncelog.cli.main", "broker", "--data-dir",
               str(self.data_dir), "--port", str(self.port)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not sel.select(0):
                    self.kill()
                    raise RuntimeError(f"the broker did not start (see {self.log_path}): "
                                       + self._tail())
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        self.proc.wait()
                        raise RuntimeError(f"the broker exited: {self._tail()}")
                    buf += chunk
        m = _LISTENING.search(buf)
        if m is None:
            self.kill()
            raise RuntimeError(f"unexpected broker output {buf!r}")
        self.port = int(m.group(2))

    def _tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-10:])
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        self._signal(signal.SIGKILL)

    def stop(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

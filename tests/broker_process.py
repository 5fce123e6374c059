"""`oncelog broker` as a real subprocess, for interop, crash and restart tests.

    with BrokerProcess(tmp_path / "data") as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})
        ...
        broker.kill()       # SIGKILL: an unclean stop, as a crash or power cut would be
        broker.start()      # same data dir, same port

The broker picks a free port the first time (``--port 0``) and keeps it across restarts, so a
client that is still running reconnects to the same address. Startup waits for the broker's
"listening" line on stdout, read with a deadline, never a sleep. The broker's log (stderr) goes
to ``<data dir>.stderr.log``, beside the data directory, and its tail is shown when it fails.
"""

from __future__ import annotations

import atexit
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

_LISTENING = re.compile(rb"oncelog broker listening on ([\d.]+):(\d+)")

# Brokers still running when the test process exits (a test that raised before stopping its
# broker, a KeyboardInterrupt) are killed rather than left behind.
_RUNNING: set[subprocess.Popen] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_RUNNING):
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class BrokerProcessError(RuntimeError):
    pass


class BrokerProcess:
    def __init__(self, data_dir: str | Path, port: int = 0,
                 settings: dict[str, str] | None = None, host: str = "127.0.0.1",
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.env = dict(env or {})  # added to the broker's environment (PYTHONPATH, ...)
        self.host = host
        self.port = port
        self.settings = dict(settings or {})
        self.stderr_path = self.data_dir.with_name(self.data_dir.name + ".stderr.log")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "oncelog.cli.main", "broker", "--data-dir",
               str(self.data_dir), "--host", self.host, "--port", str(self.port)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def start(self, timeout: float = 30.0) -> Self:
        """Start the broker and return once it listens (its "listening" line is read)."""
        if self.running:
            raise BrokerProcessError("broker already running")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        with open(self.stderr_path, "ab") as stderr:  # the child keeps its own descriptor
            stderr.write(f"--- start #{self.starts + 1}: {' '.join(self.command())}\n".encode())
            stderr.flush()
            self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=stderr, env=env)
        _RUNNING.add(self.proc)
        self.starts += 1
        line = self._read_line(timeout)
        m = _LISTENING.search(line)
        if m is None:
            self.kill()
            raise BrokerProcessError(f"unexpected first line from broker: {line!r}\n"
                                     + self.stderr_tail())
        self.port = int(m.group(2))
        return self

    def _read_line(self, timeout: float) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise BrokerProcessError(f"broker did not listen within {timeout}s\n"
                                             + self.stderr_tail())
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = self.proc.wait()
                    raise BrokerProcessError(f"broker exited with {rc} before listening\n"
                                             + self.stderr_tail())
                buf += chunk
        return buf.split(b"\n", 1)[0]

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a clean shutdown) and wait; returns the exit code."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self, timeout: float = 30.0) -> int:
        """SIGKILL: the broker gets no chance to flush, snapshot or mark anything clean."""
        return self._signal(signal.SIGKILL, timeout)

    def restart(self, timeout: float = 30.0) -> Self:
        """Clean stop (if running), then start again on the same data dir and port."""
        if self.running:
            rc = self.stop(timeout)
            if rc != 0:
                raise BrokerProcessError(f"broker exited with {rc} on SIGTERM\n"
                                         + self.stderr_tail())
        return self.start(timeout)

    def _signal(self, sig: int, timeout: float) -> int:
        proc = self.proc
        if proc is None:
            raise BrokerProcessError("broker was never started")
        if proc.poll() is None:
            proc.send_signal(sig)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
            raise BrokerProcessError(f"broker ignored signal {sig} for {timeout}s\n"
                                     + self.stderr_tail()) from None
        finally:
            _RUNNING.discard(proc)
            if proc.stdout is not None:
                proc.stdout.close()
        return rc

    def stderr_tail(self, lines: int = 40) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no broker log)"
        return "broker log tail:\n" + "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.running:
            self.stop()

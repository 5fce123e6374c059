"""``oncelog broker`` as a child process: the one launcher of the tests, the benchmarks,
``oncelog verify`` and the local cluster (``local_cluster.py``).

    with BrokerProcess(tmp_path / "data") as broker:
        producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap_servers})
        ...
        broker.kill()       # SIGKILL: an unclean stop, as a crash or power cut would be
        broker.start()      # same data dir, same port

The broker picks a free port the first time (``--port 0``) and keeps it across restarts, so a
client that is still running reconnects to the same address. Startup waits for the broker's
"listening" line on stdout, read with a deadline, never a sleep. Its log (stderr) and the rest of
its stdout ("stopped cleanly", ...) go to ``log_path`` (default ``<data dir>.log``, beside the
data directory; appended to across restarts), whose tail is shown when it fails. The rest of
stdout is copied by a ``cat`` of its own, not by a thread of ours: a broker that outlives this
process (``oncelog cluster up``) still has somewhere to write.

``start()`` is ``launch()`` (spawn) then ``wait_listening()``, so that a cluster's brokers can
start side by side. With ``new_session`` the broker runs in a session of its own (signals go to
its process group; a Ctrl-C at the terminal does not reach it); with ``die_with_parent`` (Linux,
util-linux's setpriv) it gets SIGKILL when the thread that started it ends. Brokers still
running when this process exits are killed, unless ``kill_at_exit=False`` (a cluster left
running on purpose).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

__all__ = ["BrokerProcess", "BrokerProcessError"]

_LISTENING = re.compile(rb"oncelog broker listening on ([\d.]+):(\d+)")
# The broker imports this very oncelog (a source checkout need not be installed).
_SOURCE_ROOT = str(Path(__file__).resolve().parents[2])

# Brokers still running when the process exits (a test that raised before stopping its broker,
# a KeyboardInterrupt) are killed rather than left behind.
_RUNNING: set[BrokerProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for broker in list(_RUNNING):
        with contextlib.suppress(BrokerProcessError, OSError):
            broker.kill(timeout=5.0)


class BrokerProcessError(RuntimeError):
    pass


class BrokerProcess:
    """One broker process on ``data_dir``; ``settings`` are ``--set`` settings (Kafka's names),
    ``env`` is added to its environment (a PYTHONPATH given there replaces this checkout's)."""

    def __init__(self, data_dir: str | Path, port: int = 0,
                 settings: dict[str, str] | None = None, host: str = "127.0.0.1",
                 env: dict[str, str] | None = None, *, log_path: str | Path | None = None,
                 node_id: int | None = None, zookeeper: str | None = None,
                 new_session: bool = False, die_with_parent: bool = False,
                 kill_at_exit: bool = True,
                 wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.env = dict(env or {})
        self.host = host
        self.port = port
        self.settings = {k: str(v) for k, v in (settings or {}).items()}
        self.node_id = node_id
        self.zookeeper = zookeeper  # zookeeper.connect: a broker of a cluster
        self.log_path = (Path(log_path) if log_path is not None
                         else self.data_dir.with_name(self.data_dir.name + ".log"))
        self.new_session = new_session
        self.die_with_parent = die_with_parent
        self.kill_at_exit = kill_at_exit
        # the command as launched, from the one that would be: ``ip netns exec NS ...`` (a
        # broker in a host of its own, oncelog.faults); the pid must stay the broker's (exec)
        self.wrap = wrap
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.starts = 0

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "oncelog.cli.main", "broker", "--data-dir",
               str(self.data_dir), "--host", self.host, "--port", str(self.port)]
        if self.node_id is not None:
            cmd += ["--node-id", str(self.node_id)]
        if self.zookeeper is not None:
            cmd += ["--zookeeper", self.zookeeper]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    # -- starting -----------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> Self:
        """Start the broker and return once it listens (its "listening" line is read)."""
        self.launch()
        return self.wait_listening(timeout)

    def launch(self) -> None:
        """Spawn the broker; ``wait_listening`` then waits for it."""
        if self.running:
            raise BrokerProcessError(f"broker on {self.data_dir} already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_SOURCE_ROOT, env.get("PYTHONPATH")) if p)
        env.update(PYTHONUNBUFFERED="1", **self.env)
        command = self.command()
        if self.die_with_parent:
            setpriv = shutil.which("setpriv")
            if setpriv:  # PR_SET_PDEATHSIG, then exec python: the pid stays the broker's
                command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        if self.wrap is not None:
            command = self.wrap(command)
        with open(self.log_path, "ab") as log:  # the child keeps its own descriptor
            log.write(f"--- start #{self.starts + 1} at {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
                      f"{' '.join(command)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=log, env=env,
                                         cwd=self.data_dir.parent,
                                         start_new_session=self.new_session)
        self.paused = False
        self.starts += 1
        if self.kill_at_exit:
            _RUNNING.add(self)

    def wait_listening(self, timeout: float = 30.0) -> Self:
        """Read the broker's first line within ``timeout`` seconds: its "listening" line, with
        the port it took. Killed and BrokerProcessError if it says anything else, says nothing
        in time, or exits first."""
        first, rest = self._read_line(timeout)
        m = _LISTENING.search(first)
        if m is None:
            self.kill()
            raise BrokerProcessError(f"unexpected first line from broker: {first!r}\n"
                                     + self.log_tail())
        self.port = int(m.group(2))
        self._copy_stdout_to_log(rest)
        return self

    def _read_line(self, timeout: float) -> tuple[bytes, bytes]:
        """The first line of stdout and what was read after it."""
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
                                             + self.log_tail())
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 4096)
                if not chunk:
                    rc = self._reap(self.proc)
                    raise BrokerProcessError(f"broker exited with {rc} before listening\n"
                                             + self.log_tail())
                buf += chunk
        first, _newline, rest = buf.partition(b"\n")
        return first, rest

    def _copy_stdout_to_log(self, already_read: bytes) -> None:
        """Hand the rest of the broker's stdout to a ``cat`` appending to the log: nothing of
        ours has to keep reading it, and the pipe never fills."""
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "ab") as log:
            log.write(already_read)
            log.flush()
            subprocess.Popen(["cat"], stdin=self.proc.stdout, stdout=log,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        # cat holds the pipe now; it exits when the broker's stdout closes (the broker exits).
        self.proc.stdout.close()

    # -- signals ------------------------------------------------------------------------------

    def send_signal(self, sig: int) -> None:
        """Signal the broker (its process group, when it runs in a session of its own)."""
        proc = self.proc
        if proc is None:
            raise BrokerProcessError("broker was never started")
        if proc.poll() is not None:
            return
        if self.new_session:
            try:
                os.killpg(proc.pid, sig)
                return
            except (ProcessLookupError, PermissionError):
                pass
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    def terminate(self) -> None:
        """SIGTERM without waiting (SIGCONT too, so that a paused broker acts on it)."""
        self.send_signal(signal.SIGTERM)
        if self.paused:
            self.send_signal(signal.SIGCONT)
            self.paused = False

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the broker to exit: its exit code (it is reaped),
        or None while it still runs."""
        proc = self.proc
        if proc is None:
            raise BrokerProcessError("broker was never started")
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self._reap(proc)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a clean shutdown) and wait; returns the exit code. A broker still running
        after ``timeout`` is killed and BrokerProcessError raised."""
        self.terminate()
        rc = self.wait(timeout)
        if rc is None:
            self.kill()
            raise BrokerProcessError(f"broker ignored SIGTERM for {timeout}s\n"
                                     + self.log_tail())
        return rc

    def kill(self, timeout: float = 30.0) -> int:
        """SIGKILL: the broker gets no chance to flush, snapshot or mark anything clean."""
        self.send_signal(signal.SIGKILL)
        self.paused = False
        rc = self.wait(timeout)
        if rc is None:
            raise BrokerProcessError(f"broker survived SIGKILL for {timeout}s")
        return rc

    def pause(self) -> None:
        """SIGSTOP: the broker neither answers nor heartbeats until ``resume``."""
        self.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self, timeout: float = 30.0) -> Self:
        """Clean stop (if running), then start again on the same data dir and port."""
        if self.running:
            rc = self.stop(timeout)
            if rc != 0:
                raise BrokerProcessError(f"broker exited with {rc} on SIGTERM\n"
                                         + self.log_tail())
        return self.start(timeout)

    def _reap(self, proc: subprocess.Popen[bytes]) -> int:
        rc = proc.wait()
        _RUNNING.discard(self)
        if proc.stdout is not None:
            proc.stdout.close()
        return rc

    # -- the log ------------------------------------------------------------------------------

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no broker log)"
        return f"the end of {self.log_path}:\n" + "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.running:
            self.stop()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"BrokerProcess({self.data_dir}, {self.bootstrap_servers}, {state})"

"""Run Apache ZooKeeper (Debian's ``zookeeper`` package) as a standalone server.

For the tests and ``oncelog cluster up``: ``ZooKeeperServer`` writes a ``zoo.cfg`` into its data
directory and starts ``QuorumPeerMain`` with it, in a session of its own (it outlives the Python
process that started it unless stopped), its output in ``zookeeper.log`` and its pid in
``zookeeper.pid`` of the data directory, and waits until it answers the four-letter words.
``stop_server(data_dir)`` stops a server another process started there (``oncelog cluster down``).

Layout of ``data_dir``::

    zoo.cfg          the configuration (absolute paths)
    data/            ZooKeeper's snapshots and transaction logs (dataDir)
    zookeeper.log    the server's output (slf4j-simple when installed, else nothing much)
    zookeeper.pid    the server's pid while it runs

ZooKeeper is located by ``find_zookeeper()``: ``$ONCELOG_ZOOKEEPER_CLASSPATH`` (a Java class path)
if set, else Debian's ``/usr/share/java/zookeeper.jar`` (its manifest names its dependencies);
Java is ``$JAVA_HOME/bin/java`` or ``java`` on the PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

__all__ = [
    "INSTALL_HINT",
    "ZooKeeperError",
    "ZooKeeperInstall",
    "ZooKeeperNotFoundError",
    "ZooKeeperServer",
    "find_zookeeper",
    "four_letter_word",
    "running_server",
    "stop_server",
]

MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
DEBIAN_JAR = "/usr/share/java/zookeeper.jar"
# slf4j's simple binding (Debian's libslf4j-java, a dependency of zookeeper): without a binding
# the server logs nothing at all.
DEBIAN_SLF4J_SIMPLE = "/usr/share/java/slf4j-simple.jar"
INSTALL_HINT = "apt-get install -y zookeeper"
CLASSPATH_ENV = "ONCELOG_ZOOKEEPER_CLASSPATH"

CONFIG_FILE = "zoo.cfg"
LOG_FILE = "zookeeper.log"
PID_FILE = "zookeeper.pid"

# A small, quickly starting JVM: ZooKeeper here holds a few hundred znodes.
DEFAULT_JVM_OPTIONS = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.jmx.log4j.disable=true",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
)


class ZooKeeperNotFoundError(RuntimeError):
    """Java or ZooKeeper's jars are not installed."""


class ZooKeeperError(RuntimeError):
    """The server did not start (or stop) as asked."""


@dataclass(frozen=True)
class ZooKeeperInstall:
    """How to run ZooKeeper here: the java binary and the class path."""

    java: str
    classpath: tuple[str, ...]
    main_class: str = MAIN_CLASS

    def command(self, config_path: str | os.PathLike[str],
                jvm_options: tuple[str, ...] = DEFAULT_JVM_OPTIONS) -> list[str]:
        return [self.java, *jvm_options, "-cp", os.pathsep.join(self.classpath),
                self.main_class, os.fspath(config_path)]


def find_zookeeper() -> ZooKeeperInstall:
    """Java and ZooKeeper's class path; ZooKeeperNotFoundError (naming the Debian package to
    install) when either is missing."""
    java_home = os.environ.get("JAVA_HOME")
    java = None
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        java = os.path.join(java_home, "bin", "java")
    if java is None:
        java = shutil.which("java")
    custom = os.environ.get(CLASSPATH_ENV)
    if custom:
        classpath: tuple[str, ...] = tuple(p for p in custom.split(os.pathsep) if p)
    elif os.path.isfile(DEBIAN_JAR):
        classpath = (DEBIAN_JAR,)
        if os.path.isfile(DEBIAN_SLF4J_SIMPLE):
            classpath += (DEBIAN_SLF4J_SIMPLE,)
    else:
        raise ZooKeeperNotFoundError(
            f"Apache ZooKeeper is not installed ({DEBIAN_JAR} is missing): install Debian's "
            f"package with `{INSTALL_HINT}` (or set {CLASSPATH_ENV} to its class path)")
    if java is None:
        raise ZooKeeperNotFoundError(
            f"no java to run ZooKeeper with (not on the PATH, no $JAVA_HOME): `{INSTALL_HINT}` "
            "brings a Java runtime along")
    return ZooKeeperInstall(java, classpath)


def four_letter_word(host: str, port: int, word: str = "ruok", timeout: float = 2.0) -> str:
    """Send one of ZooKeeper's four-letter words (``ruok``, ``srvr``, ``stat``, ``mntr``...) and
    return the answer ('' when the server closes without one); OSError when unreachable."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(word.encode("ascii"))
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` lives (a zombie, exited but not reaped yet, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not reaped yet) counts as gone.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[-1].split()
        if fields and fields[0] == b"Z":
            return False
    return True


def runs_with(pid: int, *args: bytes) -> bool:
    """Whether the live process ``pid`` has every one of ``args`` on its command line: it is the
    process that was started, not one that reused its pid."""
    if not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: trust the pid file
        return True
    return all(a in argv for a in args)


def _is_our_server(pid: int, config_path: Path) -> bool:
    """Whether ``pid`` is the ZooKeeper started with ``config_path``."""
    return runs_with(pid, MAIN_CLASS.encode(), os.fsencode(config_path))


def signal_group(pid: int, sig: int) -> None:
    """Signal the process group ``pid`` leads (servers and brokers run in sessions of their
    own), else the process."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_gone(pids: list[int], timeout: float,
              procs: Mapping[int, subprocess.Popen[bytes]] | None = None) -> list[int]:
    """Wait until the processes are gone (reaping children we started: ``procs``); those still
    alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            proc = procs.get(pid) if procs else None
            if proc is not None:
                if proc.poll() is None:
                    alive.append(pid)
            elif pid_alive(pid):
                alive.append(pid)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.02)


def _wait_gone(pid: int, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> bool:
    return not wait_gone([pid], timeout, {pid: proc} if proc is not None else None)


def _read_config(data_dir: Path) -> dict[str, str]:
    out = {}
    with contextlib.suppress(FileNotFoundError):
        for line in (data_dir / CONFIG_FILE).read_text().splitlines():
            if "=" in line and not line.lstrip().startswith("#"):
                key, _, value = line.partition("=")
                out[key.strip()] = value.strip()
    return out


def _read_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / PID_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def running_server(data_dir: str | os.PathLike[str]) -> tuple[int, str] | None:
    """``(pid, connect_string)`` of the server started in ``data_dir`` (by any process) if it
    still runs, else None."""
    data_dir = Path(data_dir).resolve()
    pid = _read_pid(data_dir)
    if pid is None or not _is_our_server(pid, data_dir / CONFIG_FILE):
        return None
    cfg = _read_config(data_dir)
    host = cfg.get("clientPortAddress", "127.0.0.1")
    return pid, f"{host}:{cfg.get('clientPort', '2181')}"


def stop_server(data_dir: str | os.PathLike[str], timeout: float = 10.0) -> bool:
    """Stop the server started in ``data_dir`` by another process (its pid file): SIGTERM, then
    SIGKILL after ``timeout``. False when none was running there."""
    data_dir = Path(data_dir).resolve()
    found = running_server(data_dir)
    if found is None:
        (data_dir / PID_FILE).unlink(missing_ok=True)
        return False
    pid = found[0]
    signal_group(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        signal_group(pid, signal.SIGKILL)
        if not _wait_gone(pid, 5.0):
            raise ZooKeeperError(f"ZooKeeper (pid {pid}) survived SIGKILL")
    (data_dir / PID_FILE).unlink(missing_ok=True)
    return True


class ZooKeeperServer:
    """A standalone ZooKeeper server in ``data_dir``.

    ``port=0`` picks a free port at the first ``start`` (kept for restarts, so clients can come
    back). ``fsync=False`` writes ``forceSync=no`` (tests: no fsync per transaction).
    ``tick_time_ms`` also bounds how finely sessions expire; sessions may be as short as
    ``min_session_timeout_ms``. ``die_with_parent`` (tests; Linux with util-linux's setpriv): the
    server gets SIGKILL when the thread that started it ends (its process killed, say), instead
    of outliving it.
    """

    def __init__(self, data_dir: str | os.PathLike[str], port: int = 0,
                 host: str = "127.0.0.1", *, tick_time_ms: int = 500,
                 min_session_timeout_ms: int = 1000, max_session_timeout_ms: int = 60000,
                 fsync: bool = True, jvm_options: tuple[str, ...] = DEFAULT_JVM_OPTIONS,
                 install: ZooKeeperInstall | None = None, die_with_parent: bool = False,
                 ensemble: Mapping[int, str] | None = None, myid: int | None = None,
                 wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port
        self.tick_time_ms = tick_time_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.fsync = fsync
        self.jvm_options = tuple(jvm_options)
        self._install = install
        self.die_with_parent = die_with_parent
        # A member of an ensemble (oncelog.faults): server id -> host of every member (quorum
        # port 2888, election port 3888 on each), this one's id ``myid``. ``wrap``: the command
        # as launched (``ip netns exec NS ...``: a server in a host of its own; an exec, so the
        # pid stays the server's).
        self.ensemble = dict(ensemble or {})
        self.myid = myid
        if self.ensemble and myid not in self.ensemble:
            raise ValueError(f"myid {myid} is not in the ensemble {sorted(self.ensemble)}")
        self.wrap = wrap
        self._proc: subprocess.Popen[bytes] | None = None

    # -- paths and addresses ------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def pid_path(self) -> Path:
        return self.data_dir / PID_FILE

    @property
    def connect_string(self) -> str:
        """``host:port``; of the server another process started in ``data_dir`` if this object
        did not start one."""
        if self.port:
            return f"{self.host}:{self.port}"
        found = running_server(self.data_dir) if self._proc is None else None
        if found is None:
            raise ZooKeeperError("the server has no port yet (start it first)")
        return found[1]

    @property
    def pid(self) -> int | None:
        """The server's pid (also when another process started it in ``data_dir``)."""
        if self._proc is not None:
            return self._proc.pid
        found = running_server(self.data_dir)
        return None if found is None else found[0]

    def is_running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return running_server(self.data_dir) is not None

    def four_letter_word(self, word: str, timeout: float = 2.0) -> str:
        return four_letter_word(self.host, self.port, word, timeout)

    # -- life cycle ---------------------------------------------------------------------------

    def _write_config(self) -> None:
        lines = [
            f"tickTime={self.tick_time_ms}",
            f"dataDir={self.data_dir / 'data'}",
            f"clientPort={self.port}",
            f"clientPortAddress={self.host}",
            f"minSessionTimeout={self.min_session_timeout_ms}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "maxClientCnxns=0",
            "admin.enableServer=false",
            "4lw.commands.whitelist=*",
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
        ]
        if not self.fsync:
            lines.append("forceSync=no")
        if self.ensemble:
            lines += ["initLimit=10", "syncLimit=5", "cnxTimeout=2000"]
            lines += [f"server.{sid}={host}:2888:3888"
                      for sid, host in sorted(self.ensemble.items())]
            (self.data_dir / "data" / "myid").write_text(f"{self.myid}\n")
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(self.config_path)

    def _tail_log(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> Self:
        """Start the server and wait (up to ``timeout`` seconds) until it serves requests.
        ``wait=False``: return once spawned (the members of an ensemble serve only once a
        quorum of them runs); ``wait_serving`` then waits."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        install = self._install or find_zookeeper()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "data").mkdir(exist_ok=True)
        other = running_server(self.data_dir)
        if other is not None:
            raise ZooKeeperError(f"a ZooKeeper already runs in {self.data_dir} "
                                 f"(pid {other[0]}, {other[1]})")
        choose_port = self.port == 0
        attempts = 3 if choose_port else 1
        deadline = time.monotonic() + timeout
        for attempt in range(attempts):
            if choose_port:
                self.port = _free_port(self.host)
            self._write_config()
            command = install.command(self.config_path, self.jvm_options)
            setpriv = shutil.which("setpriv") if self.die_with_parent else None
            if setpriv:  # util-linux: PR_SET_PDEATHSIG, then exec java
                command = [setpriv, "--pdeathsig", "KILL", "--", *command]
            if self.wrap is not None:
                command = self.wrap(command)
            with open(self.log_path, "ab") as out:
                self._proc = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT, cwd=self.data_dir,
                    start_new_session=True)
            self.pid_path.write_text(f"{self._proc.pid}\n")
            if not wait:
                return self
            try:
                self._wait_serving(deadline)
                return self
            except ZooKeeperError:
                rc = self._proc.poll()
                tail = self._tail_log()
                self.kill()
                if choose_port and rc is not None and attempt + 1 < attempts \
                        and "Address already in use" in tail:
                    continue  # lost the race for the free port: another one
                if choose_port:
                    self.port = 0
                raise ZooKeeperError(
                    f"ZooKeeper did not start on {self.host}:{self.port} "
                    f"({'exit code ' + str(rc) if rc is not None else 'no answer'} within "
                    f"{timeout:.0f} s); the end of {self.log_path}:\n{tail}") from None
        raise AssertionError("unreachable")

    def wait_serving(self, timeout: float = 30.0) -> Self:
        """Until the server (started with ``wait=False``) serves requests; ZooKeeperError
        (the end of its log) when it exits or ``timeout`` runs out."""
        try:
            self._wait_serving(time.monotonic() + timeout)
        except ZooKeeperError as exc:
            rc = self._proc.poll() if self._proc is not None else None
            raise ZooKeeperError(
                f"ZooKeeper did not serve on {self.host}:{self.port} ({exc}, "
                f"{'exit code ' + str(rc) if rc is not None else 'no answer'} within "
                f"{timeout:.0f} s); the end of {self.log_path}:\n{self._tail_log()}") from None
        return self

    def _wait_serving(self, deadline: float) -> None:
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise ZooKeeperError("exited")
            try:
                # ``srvr`` answers "This ZooKeeper instance is not currently serving requests"
                # until the server is up.
                if self.four_letter_word("srvr", timeout=1.0).startswith("Zookeeper version"):
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise ZooKeeperError("timeout")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful (SIGTERM), then SIGKILL after ``timeout`` seconds. Without a server of
        its own, stops the one another process started in ``data_dir`` (its pid file)."""
        proc = self._proc
        if proc is None:
            stop_server(self.data_dir, timeout)
            return
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGTERM)
            if not _wait_gone(proc.pid, timeout, proc):
                signal_group(proc.pid, signal.SIGKILL)
        self._reap()

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the clients can tell."""
        proc = self._proc
        if proc is None:
            found = running_server(self.data_dir)
            if found is not None:
                signal_group(found[0], signal.SIGKILL)
                _wait_gone(found[0], 5.0)
                self.pid_path.unlink(missing_ok=True)
            return
        if proc.poll() is None:
            signal_group(proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        proc = self._proc
        assert proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10.0)
        self._proc = None
        with contextlib.suppress(OSError, ValueError):
            if int(self.pid_path.read_text().strip()) == proc.pid:
                self.pid_path.unlink()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running() else "stopped"
        return f"ZooKeeperServer({self.host}:{self.port}, {self.data_dir}, {state})"

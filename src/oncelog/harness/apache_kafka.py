"""A real Apache Kafka beside oncelog: brokers in KRaft mode on loopback, and Kafka's own tools,
for the tests and the benchmarks that compare the two.

    with ApacheKafka(tmp_path / "kafka") as kafka:          # one combined broker+controller
        kafka.bootstrap_servers                               # "127.0.0.1:PORT"
    with ApacheKafka(tmp_path / "kafka", nodes=3) as kafka:  # three, for replication

Kafka comes from ``scripts/kafka.sh`` (which resolves it from Maven Central on first use into
``.cache/kafka``). Each node runs with a fixed heap (``heap``, default 512 MiB, -Xms = -Xmx), is
formatted with ``kafka-storage format`` under a cluster id of our own, and is stopped by its PID
(SIGTERM, then SIGKILL). With ``die_with_parent`` (Linux, util-linux's setpriv) a node gets
SIGKILL when the thread that started it ends, so a killed test run leaves no JVM behind.

``KafkaTools`` runs Kafka's command-line tools (the same main classes as ``scripts/kafka.sh
TOOL``) in one long-lived JVM of its own, one tool at a time: a tool costs a few milliseconds
instead of a JVM start (~1.5 s here), which is what lets the suite run hundreds of them.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Self

__all__ = [
    "ApacheKafka",
    "ApacheKafkaError",
    "KafkaTools",
    "ToolResult",
    "kafka_available",
    "kafka_classpath",
    "kafka_sh",
    "kafka_version",
]

_ROOT = Path(__file__).resolve().parents[3]
KAFKA_SH = _ROOT / "scripts" / "kafka.sh"
_RUNNER_SOURCE = Path(__file__).with_name("KafkaToolRunner.java")

_RUNNING: set[ApacheKafka] = set()


@atexit.register
def _kill_leftovers() -> None:
    for kafka in list(_RUNNING):
        with contextlib.suppress(OSError):
            kafka.stop(timeout=5.0)


class ApacheKafkaError(RuntimeError):
    pass


def kafka_available() -> str | None:
    """None when Kafka can be had here (Java, and Maven or an installed cache); else why not."""
    if shutil.which("java") is None:
        return "Java is not installed"
    if shutil.which("mvn") is None and not (_ROOT / ".cache" / "kafka" / "current").exists():
        return "Maven (mvn) is not installed, and Apache Kafka is not in .cache/kafka"
    return None


def kafka_sh(*args: str, timeout: float = 600.0, env: dict[str, str] | None = None,
             input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``bash scripts/kafka.sh ARGS...`` (a tool in a JVM of its own), output captured."""
    return subprocess.run(["bash", str(KAFKA_SH), *args], check=False, capture_output=True,
                          timeout=timeout,
                          env={**os.environ, **(env or {})}, input=input)


def _kafka_sh_line(arg: str) -> str:
    out = kafka_sh(arg)
    if out.returncode != 0:
        raise ApacheKafkaError(f"scripts/kafka.sh {arg} failed:\n{out.stderr.decode()}")
    return out.stdout.decode().strip()


def kafka_version() -> str:
    """The Apache Kafka version in use (installing it on first use)."""
    return _kafka_sh_line("version")


def kafka_classpath() -> str:
    """The ':'-separated jars of Kafka's broker, tools, client and Streams."""
    return _kafka_sh_line("classpath")


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _cluster_id() -> str:
    """A Kafka Uuid as Kafka prints it: 16 random bytes, URL-safe base64 without padding; like
    Kafka's Uuid.randomUuid, never one starting with '-' (a command line would take it for an
    option: `kafka-storage format -t -xyz...` fails)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass
class _Node:
    node_id: int
    port: int
    controller_port: int
    properties: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log_start: int = 0  # where this start's lines begin in log_path


class ApacheKafka:
    """``nodes`` combined broker+controller KRaft nodes on ``host``; ``settings`` are added to
    every node's server.properties (Kafka's names)."""

    def __init__(self, directory: str | Path, nodes: int = 1, *, host: str = "127.0.0.1",
                 heap: str = "512M", settings: dict[str, str] | None = None,
                 die_with_parent: bool = True, tools: KafkaTools | None = None) -> None:
        self.directory = Path(directory)
        self.host = host
        self.heap = heap
        self.settings = {k: str(v) for k, v in (settings or {}).items()}
        self.die_with_parent = die_with_parent
        self.tools = tools  # formats the nodes in its JVM rather than one JVM each
        self.cluster_id = _cluster_id()
        self.nodes = [_Node(i + 1, _free_port(host), _free_port(host),
                            self.directory / f"node{i + 1}" / "server.properties",
                            self.directory / f"node{i + 1}.log") for i in range(nodes)]
        self.formatted = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    def _properties(self, node: _Node) -> dict[str, str]:
        voters = ",".join(f"{n.node_id}@{self.host}:{n.controller_port}" for n in self.nodes)
        rf = str(min(3, len(self.nodes)))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{self.host}:{node.port},"
                         f"CONTROLLER://{self.host}:{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(node.properties.parent / "data"),
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": "1" if rf == "1" else "2",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": "1" if rf == "1" else "2",
            "group.initial.rebalance.delay.ms": "0",
            "num.partitions": "1",
        }
        props.update(self.settings)
        return props

    def format(self) -> None:
        """Write each node's server.properties and ``kafka-storage format`` it (side by side,
        or one after another in ``tools``' JVM)."""
        procs = []
        for node in self.nodes:
            node.properties.parent.mkdir(parents=True, exist_ok=True)
            node.properties.write_text("".join(f"{k}={v}\n"
                                               for k, v in self._properties(node).items()))
            if self.tools is not None:
                self.tools.run("kafka-storage", "format", "-t", self.cluster_id, "-c",
                               str(node.properties), "--ignore-formatted").check()
                continue
            procs.append((node, subprocess.Popen(
                ["bash", str(KAFKA_SH), "kafka-storage", "format", "-t", self.cluster_id,
                 "-c", str(node.properties), "--ignore-formatted"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
        for node, proc in procs:
            out, _ = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise ApacheKafkaError(f"kafka-storage format of node {node.node_id} failed:\n"
                                       + out.decode(errors="replace"))
        self.formatted = True

    def start(self, timeout: float = 120.0) -> Self:
        """Format (the first time), start every node, and return once each says it started."""
        if not self.formatted:
            self.format()
        for node in self.nodes:
            self._launch(node)
        _RUNNING.add(self)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            self._wait_started(node, deadline)
        return self

    def _launch(self, node: _Node) -> None:
        env = {**os.environ, "KAFKA_HEAP_OPTS": f"-Xmx{self.heap} -Xms{self.heap}",
               "LOG_DIR": str(self.directory / "logs")}
        command = ["bash", str(KAFKA_SH), "kafka-server-start", str(node.properties)]
        if self.die_with_parent and shutil.which("setpriv"):
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        with open(node.log_path, "ab") as log:
            node.log_start = log.tell()
            # kafka.sh execs java: the pid is the JVM's, and setpriv's death signal stays on it
            node.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def _wait_started(self, node: _Node, deadline: float) -> None:
        assert node.proc is not None
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise ApacheKafkaError(f"Kafka node {node.node_id} exited with "
                                       f"{node.proc.returncode}\n{self.log_tail(node)}")
            with contextlib.suppress(OSError), open(node.log_path, "rb") as log:
                log.seek(node.log_start)
                if b"Kafka Server started" in log.read():
                    return
            time.sleep(0.2)
        raise ApacheKafkaError(f"Kafka node {node.node_id} did not start in time\n"
                               + self.log_tail(node))

    def log_tail(self, node: _Node, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(node.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (a crash); ``restart(node_id)`` brings it back on the same ports."""
        node = self.nodes[node_id - 1]
        if node.proc is not None and node.proc.poll() is None:
            node.proc.kill()
            node.proc.wait(30)

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        node = self.nodes[node_id - 1]
        self._launch(node)
        self._wait_started(node, time.monotonic() + timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM every node (a clean shutdown), SIGKILL what is left after ``timeout``."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(30)
        _RUNNING.discard(self)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the tools, in one JVM ---------------------------------------------------------------------

@dataclass
class ToolResult:
    tool: str
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> ToolResult:
        if self.returncode != 0:
            raise ApacheKafkaError(f"{self.tool} {' '.join(self.args)} exited with "
                                   f"{self.returncode}\nstdout:\n{self.stdout}\n"
                                   f"stderr:\n{self.stderr}")
        return self


def _tool_classes() -> dict[str, str]:
    """Tool name -> main class, read from scripts/kafka.sh (the one list of them)."""
    import re

    text = KAFKA_SH.read_text()
    return {m.group(1): m.group(2)
            for m in re.finditer(r"^\s+\[([\w-]+)\]=([\w.$]+)\s*$", text, re.MULTILINE)}


class KafkaTools:
    """Kafka's command-line tools run in one long-lived JVM (see the module's docstring).

        tools = KafkaTools(work_dir)
        r = tools.run("kafka-topics", "--bootstrap-server", bs, "--list")
        r.returncode, r.stdout, r.stderr

    A tool's ``Exit.exit`` is caught (the JVM goes on), its stdin is ``input`` (or empty), its
    stdout and stderr are captured. One tool runs at a time (a lock): the JVM's System.out is
    one. A tool that does not return within ``timeout`` kills the JVM (the next call starts
    another) and raises TimeoutError.
    """

    def __init__(self, work_dir: str | Path, heap: str = "256M") -> None:
        self.work_dir = Path(work_dir)
        self.heap = heap
        self.classes = _tool_classes()
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._seq = 0

    def _compile(self) -> Path:
        out = self.work_dir / "runner"
        cls = out / "KafkaToolRunner.class"
        if cls.exists() and cls.stat().st_mtime >= _RUNNER_SOURCE.stat().st_mtime:
            return out
        out.mkdir(parents=True, exist_ok=True)
        javac = subprocess.run(["javac", "-d", str(out), "-cp", kafka_classpath(),
                                str(_RUNNER_SOURCE)], check=False, capture_output=True,
                               timeout=300)
        if javac.returncode != 0:
            raise ApacheKafkaError("javac KafkaToolRunner.java failed:\n"
                                   + javac.stderr.decode(errors="replace"))
        return out

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        runner = self._compile()
        conf = _ROOT / "scripts" / "kafka"
        command = ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                   f"-Dlog4j2.configurationFile={conf / 'tools-log4j2.yaml'}",
                   "-cp", f"{runner}:{kafka_classpath()}", "KafkaToolRunner"]
        if shutil.which("setpriv"):
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, cwd=self.work_dir)
        return self._proc

    def run(self, tool: str, *args: str, input: str | bytes | None = None,
            timeout: float = 120.0) -> ToolResult:
        tool = tool.removesuffix(".sh")
        main = self.classes.get(tool)
        if not main:
            raise ValueError(f"unknown Kafka tool {tool!r}")
        with self._lock:
            self._seq += 1
            job = self.work_dir / f"job{self._seq}"
            job.mkdir(parents=True, exist_ok=True)
            data = input.encode() if isinstance(input, str) else (input or b"")
            (job / "stdin").write_bytes(data)
            (job / "args").write_bytes(b"\0".join(a.encode() for a in (main, *args)))
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{job}\n".encode())
            proc.stdin.flush()
            line = self._read_line(proc, timeout)
            if line is None:
                proc.kill()
                proc.wait(10)
                self._proc = None
                raise TimeoutError(f"{tool} {' '.join(args)} did not return in {timeout}s; "
                                   f"output so far:\n"
                                   + (job / "stdout").read_text(errors="replace"))
            rc = int(line)
            result = ToolResult(tool, list(args), rc,
                                (job / "stdout").read_text(errors="replace"),
                                (job / "stderr").read_text(errors="replace"))
            shutil.rmtree(job, ignore_errors=True)
            return result

    def _read_line(self, proc: subprocess.Popen[bytes], timeout: float) -> str | None:
        import selectors

        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        buf = b""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 64)
                if not chunk:
                    raise ApacheKafkaError("the Kafka tool JVM exited")
                buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

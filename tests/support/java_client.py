"""Apache Kafka's Java client driven from the tests: tests/java/JavaClient.java, compiled once
per session (shared by the xdist workers) with javac against Kafka's jars (the ``kafka_jars``
fixture's classpath), run in a JVM per group of scenarios with a small fixed heap.

The program prints JSON lines (``{"event": ..., ...}``); ``JavaClient.run`` returns them. With
``request_log`` the client's NetworkClient logs every request it sends there
(tests/java/log4j2.properties), and ``requests_sent`` reads it back: which API, which version,
from which client id.
"""

from __future__ import annotations

import fcntl
import json
import queue
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

JAVA_DIR = Path(__file__).resolve().parents[1] / "java"
SOURCE = JAVA_DIR / "JavaClient.java"
LOG_CONFIG = JAVA_DIR / "log4j2.properties"
JVM_OPTIONS = ("-Xmx192m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")

_SENDING = re.compile(r"Sending (\w+) request with header RequestHeader\(apiKey=(\w+), "
                      r"apiVersion=(\d+), clientId=([^,]*),")


class JavaClientError(RuntimeError):
    pass


def compile_once(classpath: str, classes: Path) -> Path:
    """javac JavaClient.java into ``classes``, unless a class file newer than the source is
    there: the session's workers share one directory (under a lock), so it compiles once."""
    classes.mkdir(parents=True, exist_ok=True)
    with open(classes / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        compiled = classes / "JavaClient.class"
        if compiled.exists() and compiled.stat().st_mtime >= SOURCE.stat().st_mtime:
            return classes
        out = subprocess.run(["javac", "-nowarn", "-Xlint:-removal", "-d", str(classes),
                              "-cp", classpath, str(SOURCE)],
                             capture_output=True, text=True, timeout=300, check=False)
        if out.returncode != 0:
            raise JavaClientError(f"javac {SOURCE.name} failed:\n{out.stderr}")
        return classes


class JavaClient:
    def __init__(self, classpath: str, classes: Path, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.classpath = f"{compile_once(classpath, classes)}:{classpath}"
        self.started: list[JavaProcess] = []

    def close(self) -> None:
        """Kill what ``start`` started and is still running (a test that failed midway)."""
        for p in self.started:
            if p.proc.poll() is None:
                p.sigkill()

    def command(self, *args: str, request_log: Path | None = None) -> list[str]:
        props = [f"-Dlog4j2.configurationFile={LOG_CONFIG}"]
        if request_log is not None:
            props.append(f"-Drequestlog={request_log}")
        command = ["java", *JVM_OPTIONS, *props, "-cp", self.classpath, "JavaClient", *args]
        if shutil.which("setpriv"):  # SIGKILL when the test process dies
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        return command

    def run(self, *args: str, request_log: Path | None = None,
            timeout: float = 180) -> list[dict[str, Any]]:
        """Run the program to its end; its events. JavaClientError if it exits non-zero."""
        out = subprocess.run(self.command(*args, request_log=request_log), capture_output=True,
                             text=True, timeout=timeout, check=False, cwd=self.work_dir)
        if out.returncode != 0:
            raise JavaClientError(f"JavaClient {' '.join(args)} exited with {out.returncode}\n"
                                  f"stdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-5000:]}")
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    def start(self, *args: str, stderr: Path) -> JavaProcess:
        """Start the program (its stderr appended to ``stderr``); read its events with
        ``next_event``. Its stdin stays open: a copier holding a transaction waits on it."""
        with open(stderr, "ab") as err:
            proc = subprocess.Popen(self.command(*args), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, text=True,
                                    cwd=self.work_dir)
        self.started.append(JavaProcess(proc, stderr))
        return self.started[-1]


class JavaProcess:
    """A running JavaClient: its events, read by a thread as it prints them."""

    def __init__(self, proc: subprocess.Popen[str], stderr: Path) -> None:
        self.proc = proc
        self.stderr = stderr
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)  # the program closed its stdout: it ended

    def next_event(self, name: str, until: Callable[[dict[str, Any]], bool] = lambda e: True,
                   timeout: float = 120.0) -> dict[str, Any]:
        """The next event called ``name`` for which ``until`` holds (earlier ones are
        skipped); JavaClientError if the program ends first or ``timeout`` passes (then it is
        killed)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.proc.kill()
                self.proc.wait(30)
                raise JavaClientError(f"no {name} event in {timeout}s:\n"
                                      + self.stderr.read_text()[-3000:]) from None
            if event is None:
                self.proc.wait(30)
                raise JavaClientError(f"exited with {self.proc.returncode} before a {name} "
                                      "event:\n" + self.stderr.read_text()[-3000:])
            if event["event"] == name and until(event):
                return event

    def sigkill(self) -> int:
        self.proc.kill()
        return self.proc.wait(30)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)


def events_by_name(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["event"]: e for e in events}


def requests_sent(request_log: Path) -> Counter[tuple[str, str, int]]:
    """(client id, API, version) -> how many requests the client sent, from its request log."""
    counts: Counter[tuple[str, str, int]] = Counter()
    for line in request_log.read_text().splitlines():
        m = _SENDING.search(line)
        if m:
            counts[(m.group(4), m.group(2), int(m.group(3)))] += 1
    return counts

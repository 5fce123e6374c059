"""Workload client processes for the fault runs (issue 31): Jepsen's queue workload, the
exactly-once copier and the final drain, each a process of its own writing its own history
file (JSON lines, flushed per line; the queue format of Jepsen's Kafka workload).

    python -m oncelog.faults.clients --kind oncelog --role queue --process oncelog-1 \\
        --bootstrap 198.18.7.21:9092 --history history-oncelog-1.jsonl --seed 3 \\
        --duration 30 --keys queue:0,queue:1 --txn-ratio 0.5 --poll-mode subscribe

Kinds: ``oncelog`` (our client: transaction version 2 when the broker offers it),
``confluent`` (confluent-kafka: transaction version 1, verified by the broker as KIP-890 part
1 says), and Kafka's Java client (QueueClient.java beside this file, the same flags and lines:
``java_command``). ``command`` / ``java_command`` build the argv a runner starts (prefixed with
``ip netns exec NS`` by the runner), so that it never spells the flags itself.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

KINDS = ("oncelog", "confluent", "java")
ROLES = ("queue", "copier", "drain")
JAVA_SOURCE = Path(__file__).resolve().with_name("QueueClient.java")
JVM_OPTIONS = ("-Xmx160m", "-Xms32m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Xss512k")


def _flags(options: dict[str, Any]) -> list[str]:
    from .__main__ import option_names

    known = option_names()
    out: list[str] = []
    for name, value in options.items():
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if flag not in known:
            raise TypeError(f"no such client option: {name} ({flag})")
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple, set, frozenset)):
            value = ",".join(str(v) for v in value)
        out += [flag, str(value)]
    return out


def command(kind: str, role: str, *, process: str, bootstrap: str, history: str | Path,
            python: str = sys.executable, **options: Any) -> list[str]:
    """The argv of one client process of ``kind`` (``oncelog`` | ``confluent``) playing
    ``role`` (``queue`` | ``copier`` | ``drain``). ``options``: the other flags of
    ``python -m oncelog.faults.clients --help`` with underscores (``seed=3``,
    ``keys=["queue:0", "queue:1"]``, ``txn_ratio=0.5``, ``poll_mode="subscribe"``,
    ``transactional_id="t-1"``, ``input=[...]``, ``output=[...]``); lists are joined with
    commas, None is left out. TypeError for an unknown option."""
    if kind not in ("oncelog", "confluent"):
        raise ValueError(f"kind is oncelog or confluent (java: java_command), not {kind!r}")
    if role not in ROLES:
        raise ValueError(f"role is one of {ROLES}, not {role!r}")
    return [python, "-m", "oncelog.faults.clients", "--kind", kind, "--role", role,
            "--process", process, "--bootstrap", bootstrap, "--history", str(history),
            *_flags(options)]


def compile_java(classes: str | Path, classpath: str) -> Path:
    """javac QueueClient.java into ``classes`` unless a class file newer than the source is
    there (under a lock: parallel callers compile it once)."""
    classes = Path(classes)
    classes.mkdir(parents=True, exist_ok=True)
    with open(classes / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        compiled = classes / "QueueClient.class"
        if compiled.exists() and compiled.stat().st_mtime >= JAVA_SOURCE.stat().st_mtime:
            return classes
        out = subprocess.run(["javac", "-nowarn", "-Xlint:-removal", "-d", str(classes),
                              "-cp", classpath, str(JAVA_SOURCE)],
                             capture_output=True, text=True, timeout=300, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"javac {JAVA_SOURCE.name} failed:\n{out.stderr}")
        return classes


def java_command(role: str, *, classes: str | Path, process: str, bootstrap: str,
                 history: str | Path, classpath: str | None = None,
                 jvm_options: Iterable[str] = JVM_OPTIONS, die_with_parent: bool = False,
                 **options: Any) -> list[str]:
    """The argv of a client process of Kafka's Java client (QueueClient.java, compiled into
    ``classes`` on first use against ``classpath``: Kafka's jars, ``bash scripts/kafka.sh
    classpath`` when not given). The same roles and options as ``command``.
    ``die_with_parent``: prefixed with util-linux's ``setpriv --pdeathsig KILL`` (the JVM gets
    SIGKILL when the thread that started it ends)."""
    if role not in ROLES:
        raise ValueError(f"role is one of {ROLES}, not {role!r}")
    if classpath is None:
        from ...harness.apache_kafka import kafka_classpath

        classpath = kafka_classpath()
    compiled = compile_java(classes, classpath)
    argv = ["java", *jvm_options, "-cp", f"{compiled}:{classpath}", "QueueClient",
            "--kind", "java", "--role", role, "--process", process, "--bootstrap", bootstrap,
            "--history", str(history), *_flags(options)]
    if die_with_parent and shutil.which("setpriv"):
        argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
    return argv


__all__ = ["KINDS", "ROLES", "command", "compile_java", "java_command"]

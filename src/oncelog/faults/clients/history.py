"""A client process's own history file: JSON lines in the queue format of Jepsen's Kafka
workload, each line written and flushed on its own so that a SIGKILL leaves every line of what
the process did (an op cut off mid-way has its invoke and no completion: the runner completes
it with ``info``).

``time`` is CLOCK_MONOTONIC in nanoseconds (``time.monotonic_ns()``; the Java client's
``System.nanoTime()`` reads the same clock on Linux), so the runner can merge the files of
several processes by time.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

Key = str  # "topic:partition"


def key(topic: str, partition: int) -> Key:
    return f"{topic}:{partition}"


def split_key(k: Key) -> tuple[str, int]:
    topic, _, partition = k.rpartition(":")
    if not topic:
        raise ValueError(f"a key is topic:partition, not {k!r}")
    return topic, int(partition)


class HistoryFile:
    """Appends the lines of one process (``process``) to ``path``."""

    def __init__(self, path: str | os.PathLike[str], process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)

    def write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._file.flush()

    def meta(self, f: str, value: Any = None, **fields: Any) -> None:
        line: dict[str, Any] = {"type": "meta", "f": f, "process": self.process,
                                "time": time.monotonic_ns()}
        if value is not None:
            line["value"] = value
        line.update(fields)
        self.write(line)

    def invoke(self, f: str, value: Any, txn: bool = False, at: int | None = None) -> Op:
        op = Op(self, f, txn)
        self.write({"type": "invoke", "f": f, "process": self.process,
                    "time": time.monotonic_ns() if at is None else at, "txn": txn,
                    "value": value})
        return op

    def close(self) -> None:
        self._file.close()


class Op:
    """An invoked operation, completed exactly once (ok / fail / info)."""

    def __init__(self, history: HistoryFile, f: str, txn: bool) -> None:
        self.history = history
        self.f = f
        self.txn = txn
        self.done = False

    def complete(self, kind: str, value: Any, error: str | None = None,
                 **fields: Any) -> None:
        assert kind in ("ok", "fail", "info") and not self.done
        self.done = True
        line: dict[str, Any] = {"type": kind, "f": self.f, "process": self.history.process,
                                "time": time.monotonic_ns(), "txn": self.txn, "value": value}
        if error is not None:
            line["error"] = error
        line.update(fields)
        self.history.write(line)

    def ok(self, value: Any, **fields: Any) -> None:
        self.complete("ok", value, **fields)

    def fail(self, value: Any, error: str, **fields: Any) -> None:
        self.complete("fail", value, error, **fields)

    def info(self, value: Any, error: str, **fields: Any) -> None:
        self.complete("info", value, error, **fields)

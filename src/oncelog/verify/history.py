"""A history of a transactional workload: what every writer did and what every reader saw.

Operations are plain records, saved as JSON lines (one object per line, ``"type"`` first) so that
a history can be kept and checked again later (``oncelog verify --check FILE``):

- ``write``: one record a writer sent inside a transaction: its unique value, where it went and
  the send's outcome (``ok`` acknowledged, ``failed`` definitely not written, ``unknown`` timed
  out or the connection was lost).
- ``txn``: how a transaction ended: ``committed`` (commit returned), ``aborted`` (abort returned,
  or the writer gave up on it), ``unknown`` (a commit that raised or timed out: either outcome is
  legal, but all or nothing).
- ``read``: one record a reader consumed (partition, offset, value), in the order it saw them.
- ``seek``: a reader moved its position on purpose (offsets may go back after it).
- ``reader_end``: a reader stopped: per partition the offset it reached and the end it had to
  reach (the high watermark); ``complete`` when it reached it everywhere.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TextIO

SendOutcome = Literal["ok", "failed", "unknown"]
TxnOutcome = Literal["committed", "aborted", "unknown"]
SEND_OUTCOMES = ("ok", "failed", "unknown")
TXN_OUTCOMES = ("committed", "aborted", "unknown")


@dataclass(frozen=True)
class Write:
    writer: str
    txn: int  # the writer's transaction number (0, 1, 2 ...)
    value: str
    topic: str
    partition: int
    send: SendOutcome
    transactional_id: str = ""
    type: str = field(default="write", init=False)


@dataclass(frozen=True)
class Txn:
    writer: str
    txn: int
    outcome: TxnOutcome
    transactional_id: str = ""
    detail: str = ""  # the error of a failed or indeterminate end, if any
    type: str = field(default="txn", init=False)


@dataclass(frozen=True)
class Read:
    reader: str
    topic: str
    partition: int
    offset: int
    value: str
    type: str = field(default="read", init=False)


@dataclass(frozen=True)
class Seek:
    reader: str
    topic: str
    partition: int
    offset: int
    type: str = field(default="seek", init=False)


@dataclass(frozen=True)
class PartitionEnd:
    topic: str
    partition: int
    reached: int  # the reader's position when it stopped
    end: int  # the high watermark it had to reach


@dataclass(frozen=True)
class ReaderEnd:
    reader: str
    partitions: tuple[PartitionEnd, ...]
    type: str = field(default="reader_end", init=False)

    @property
    def complete(self) -> bool:
        return all(p.reached >= p.end for p in self.partitions)


Op = Write | Txn | Read | Seek | ReaderEnd


def op_to_dict(op: Op) -> dict[str, Any]:
    d = asdict(op)
    d = {"type": d.pop("type"), **d}
    if isinstance(op, ReaderEnd):
        d["complete"] = op.complete
    return d


def op_from_dict(d: dict[str, Any]) -> Op:
    d = dict(d)
    kind = d.pop("type", None)
    try:
        if kind == "write":
            if d.get("send") not in SEND_OUTCOMES:
                raise ValueError(f"send outcome {d.get('send')!r}")
            return Write(**d)
        if kind == "txn":
            if d.get("outcome") not in TXN_OUTCOMES:
                raise ValueError(f"transaction outcome {d.get('outcome')!r}")
            return Txn(**d)
        if kind == "read":
            return Read(**d)
        if kind == "seek":
            return Seek(**d)
        if kind == "reader_end":
            d.pop("complete", None)
            parts = tuple(PartitionEnd(**p) for p in d.pop("partitions"))
            return ReaderEnd(partitions=parts, **d)
    except TypeError as exc:
        raise ValueError(f"bad {kind} operation {d!r}: {exc}") from None
    raise ValueError(f"unknown operation type {kind!r}")


class History:
    """An append-only, thread-safe list of operations (writers and readers run in threads)."""

    def __init__(self, ops: Iterable[Op] = ()) -> None:
        self._ops: list[Op] = list(ops)
        self._lock = threading.Lock()
        self._sink: TextIO | None = None

    def add(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)
            if self._sink is not None:
                self._sink.write(json.dumps(op_to_dict(op)) + "\n")

    def stream_to(self, sink: TextIO | None) -> None:
        """Also write every operation added from now on to ``sink`` (a JSON-lines file)."""
        with self._lock:
            if sink is not None:
                for op in self._ops:
                    sink.write(json.dumps(op_to_dict(op)) + "\n")
            self._sink = sink

    @property
    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self._ops)

    def save(self, path: str | Path) -> None:
        with open(path, "w") as f:
            f.writelines(json.dumps(op_to_dict(op)) + "\n" for op in self.ops)

    @classmethod
    def load(cls, path: str | Path) -> History:
        ops = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    ops.append(op_from_dict(json.loads(line)))
                except (ValueError, json.JSONDecodeError) as exc:
                    raise ValueError(f"{path}:{n}: {exc}") from None
        return cls(ops)

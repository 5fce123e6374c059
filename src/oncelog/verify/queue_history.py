"""The queue history: what the clients of a queue workload did, one operation per JSON line.

The format follows Jepsen's Kafka workload (``jepsen.tests.kafka``), with keys spelled
``"topic:partition"`` and integer values unique per key::

    {"type": "invoke", "f": "txn", "process": "oncelog-3", "time": 123456789, "txn": true,
     "value": [["send", "queue:1", 17], ["poll"]]}
    {"type": "ok", "f": "txn", "process": "oncelog-3", "time": 123999999, "txn": true,
     "value": [["send", "queue:1", [42, 17]], ["poll", {"queue:0": [[5, 3], [6, 9]]}]]}

- ``type``: ``invoke``; then exactly one completion of the same process: ``ok`` (done),
  ``fail`` (definitely did not happen) or ``info`` (indeterminate). ``meta`` lines carry the
  workload (the first line: ``workload``, ``keys``, ``copies``) and the end of the final drain
  (``"f": "drain_end"``, value ``{key: {"reached": offset, "end": high watermark}}``).
- ``f``: ``send``, ``poll``, ``txn`` (micro-ops), ``assign`` / ``subscribe`` (a list of keys),
  ``crash`` (``info`` alone: the process died), ``commit``.
- micro-ops: invoke ``["send", key, value]`` / ok ``["send", key, [offset, value]]`` (offset -1
  or null when unknown); invoke ``["poll"]`` / ok ``["poll", {key: [[offset, value], ...]}]``.
- ``time``: CLOCK_MONOTONIC nanoseconds; ``index``: the position in the merged history.

:func:`load` reads and validates a file (a malformed line is an error naming its line number),
:func:`merge` merges the files of several processes by time, completes the operations of killed
processes with ``info`` and numbers them, :func:`pairs` pairs each invoke with its completion,
:func:`save` writes a history back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TYPES = ("invoke", "ok", "fail", "info", "meta")
COMPLETIONS = ("ok", "fail", "info")
FS = ("send", "poll", "txn", "assign", "subscribe", "crash", "commit")
MOP_FS = ("send", "poll", "txn")
WORKLOADS = ("queue", "copier", "spark")

# Fields of a line the dataclass has a place for; anything else is kept in Op.extra.
_FIELDS = ("type", "f", "process", "time", "value", "txn", "index", "error")


class HistoryError(ValueError):
    """A history file that is not a well-formed queue history (the message names the line)."""


@dataclass
class Op:
    """One line of a queue history."""

    type: str
    f: str | None = None
    process: str | None = None
    time: int | None = None
    value: Any = None
    txn: bool = False
    index: int = -1
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_meta(self) -> bool:
        return self.type == "meta"

    @property
    def is_invoke(self) -> bool:
        return self.type == "invoke"

    @property
    def is_completion(self) -> bool:
        return self.type in COMPLETIONS

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type}
        if self.f is not None:
            d["f"] = self.f
        if self.process is not None:
            d["process"] = self.process
        if self.time is not None:
            d["time"] = self.time
        if not self.is_meta or self.txn:
            d["txn"] = self.txn
        if self.value is not None or (not self.is_meta and self.f not in ("crash", None)):
            d["value"] = self.value
        if self.error is not None:
            d["error"] = self.error
        d.update(self.extra)
        if self.index >= 0:
            d["index"] = self.index
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        """An op from a parsed line, checked (:class:`HistoryError` without a line number)."""
        _validate(d)
        return cls(type=d["type"], f=d.get("f"), process=d.get("process"), time=d.get("time"),
                   value=d.get("value"), txn=bool(d.get("txn", False)),
                   index=d.get("index", -1), error=d.get("error"),
                   extra={k: v for k, v in d.items() if k not in _FIELDS})


@dataclass
class HistoryMeta:
    """The workload meta line: which workload, its keys, and for copier / spark workloads which
    output key each input key is copied to."""

    workload: str = "queue"
    keys: list[str] = field(default_factory=list)
    copies: dict[str, str] = field(default_factory=dict)


def history_meta(ops: Iterable[Op]) -> HistoryMeta:
    """The workload meta of a history (defaults when it has none)."""
    for op in ops:
        if op.is_meta and op.f is None:
            return HistoryMeta(workload=op.extra.get("workload", "queue"),
                               keys=list(op.extra.get("keys", [])),
                               copies=dict(op.extra.get("copies", {})))
    return HistoryMeta()


def drain_end(ops: Iterable[Op]) -> Op | None:
    """The last ``drain_end`` meta line, if the history has one."""
    found = None
    for op in ops:
        if op.is_meta and op.f == "drain_end":
            found = op
    return found


# -- validation ----------------------------------------------------------------------------------


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_key(k: Any, where: str) -> None:
    if not isinstance(k, str) or not k:
        raise HistoryError(f"{where}: a key is a string \"topic:partition\", not {k!r}")


def _check_pair(p: Any, where: str) -> None:
    if (not isinstance(p, list) or len(p) != 2 or not (p[0] is None or _is_int(p[0]))
            or not _is_int(p[1])):
        raise HistoryError(f"{where}: expected [offset, value] (integers; offset may be null), "
                           f"not {p!r}")


def _check_mops(value: Any, invoke: bool) -> None:
    if not isinstance(value, list):
        raise HistoryError(f"value: expected a list of micro-ops, not {value!r}")
    for i, mop in enumerate(value):
        where = f"micro-op {i}"
        if not isinstance(mop, list) or not mop or mop[0] not in ("send", "poll"):
            raise HistoryError(f"{where}: expected [\"send\", key, value] or [\"poll\", ...], "
                               f"not {mop!r}")
        if mop[0] == "send":
            if len(mop) != 3:
                raise HistoryError(f"{where}: a send is [\"send\", key, value], not {mop!r}")
            _check_key(mop[1], where)
            if _is_int(mop[2]):
                continue
            if invoke:
                raise HistoryError(f"{where}: an invoked send's value is an integer, not "
                                   f"{mop[2]!r}")
            _check_pair(mop[2], where)
        else:
            if len(mop) == 1:
                continue
            if invoke or len(mop) != 2 or not isinstance(mop[1], dict):
                raise HistoryError(f"{where}: a poll is [\"poll\"] or, completed, "
                                   f"[\"poll\", {{key: [[offset, value], ...]}}], not {mop!r}")
            for k, pairs in mop[1].items():
                _check_key(k, where)
                if not isinstance(pairs, list):
                    raise HistoryError(f"{where}: the records of {k} are a list, not {pairs!r}")
                for p in pairs:
                    _check_pair(p, f"{where} ({k})")


def _validate(d: Any) -> None:
    if not isinstance(d, dict):
        raise HistoryError(f"expected a JSON object, not {type(d).__name__}")
    kind = d.get("type")
    if kind not in TYPES:
        raise HistoryError(f"type: one of {', '.join(TYPES)}, not {kind!r}")
    if "index" in d and not _is_int(d["index"]):
        raise HistoryError(f"index: an integer, not {d['index']!r}")
    if "time" in d and d["time"] is not None and not _is_int(d["time"]):
        raise HistoryError(f"time: integer nanoseconds, not {d['time']!r}")
    if kind == "meta":
        f = d.get("f")
        if f is None:
            if "workload" in d and not isinstance(d["workload"], str):
                raise HistoryError(f"workload: a name, not {d['workload']!r}")
            keys = d.get("keys", [])
            if not isinstance(keys, list):
                raise HistoryError(f"keys: a list, not {keys!r}")
            for k in keys:
                _check_key(k, "keys")
            copies = d.get("copies", {})
            if not isinstance(copies, dict) or not all(
                    isinstance(a, str) and isinstance(b, str) for a, b in copies.items()):
                raise HistoryError(f"copies: a map of input key to output key, not {copies!r}")
        elif f == "drain_end":
            value = d.get("value")
            if not isinstance(value, dict):
                raise HistoryError(f"drain_end: value is {{key: {{\"reached\": offset, "
                                   f"\"end\": offset}}}}, not {value!r}")
            for k, v in value.items():
                _check_key(k, "drain_end")
                if (not isinstance(v, dict) or not _is_int(v.get("reached"))
                        or not _is_int(v.get("end"))):
                    raise HistoryError(f"drain_end: {k} needs integers reached and end, not "
                                       f"{v!r}")
        elif not isinstance(f, str):
            raise HistoryError(f"f: a name, not {f!r}")
        return
    f = d.get("f")
    if f not in FS:
        raise HistoryError(f"f: one of {', '.join(FS)}, not {f!r}")
    process = d.get("process")
    if not isinstance(process, str) or not process:
        raise HistoryError(f"process: a name, not {process!r}")
    if not _is_int(d.get("time")):
        raise HistoryError(f"time: integer nanoseconds, not {d.get('time')!r}")
    if "txn" in d and not isinstance(d["txn"], bool):
        raise HistoryError(f"txn: true or false, not {d['txn']!r}")
    if f == "crash" and kind != "info":
        raise HistoryError(f"a crash is an info op alone, not {kind}")
    value = d.get("value")
    if f in MOP_FS:
        if value is None and kind in ("fail", "info"):
            return  # the invoke's value stands
        _check_mops(value, kind == "invoke")
    elif f in ("assign", "subscribe"):
        if value is None and kind in ("fail", "info"):
            return
        if not isinstance(value, list):
            raise HistoryError(f"{f}: value is a list of keys, not {value!r}")
        for k in value:
            _check_key(k, f)


# -- reading, pairing, merging ---------------------------------------------------------------------


def _read_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, Op]]:
    with open(path, encoding="utf-8") as file:
        for lineno, line in enumerate(file, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HistoryError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
            try:
                yield lineno, Op.from_dict(d)
            except HistoryError as exc:
                raise HistoryError(f"{path}:{lineno}: {exc}") from None


def _check_sequence(lines: Iterable[tuple[int, Op]], path: str | os.PathLike[str]) -> None:
    """Each process is sequential: an invoke, then one completion of the same f."""
    pending: dict[str, tuple[int, Op]] = {}
    for lineno, op in lines:
        if op.is_meta or op.process is None:
            continue
        if op.is_invoke:
            if op.process in pending:
                raise HistoryError(f"{path}:{lineno}: {op.process} invokes {op.f} while its "
                                   f"{pending[op.process][1].f} of line "
                                   f"{pending[op.process][0]} has no completion")
            pending[op.process] = (lineno, op)
        elif op.f == "crash":
            pending.pop(op.process, None)  # the pending op (if any) ends indeterminate
        else:
            inv = pending.pop(op.process, None)
            if inv is None:
                raise HistoryError(f"{path}:{lineno}: {op.type} {op.f} of {op.process} "
                                   "completes nothing (no invoke pending)")
            if inv[1].f != op.f:
                raise HistoryError(f"{path}:{lineno}: {op.type} {op.f} of {op.process} "
                                   f"completes a {inv[1].f} (line {inv[0]})")


def load(path: str | os.PathLike[str]) -> list[Op]:
    """Reads and checks a queue history file. An op that was invoked and never completed (a
    killed process) is left as it is: the checker takes it as indeterminate."""
    lines = list(_read_lines(path))
    _check_sequence(lines, path)
    ops = [op for _, op in lines]
    for i, op in enumerate(ops):
        if op.index < 0:
            op.index = i
    return ops


def is_queue_history(path: str | os.PathLike[str]) -> bool:
    """Whether a file's first line is in the queue format (rather than ``verify/history.py``'s)."""
    with open(path, encoding="utf-8") as file:
        for line in file:
            if line.strip():
                try:
                    d = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(d, dict) and (
                    "f" in d or d.get("type") in ("meta", "invoke", "ok", "fail", "info"))
    return False


def _synthetic_info(inv: Op, time: int | None, why: str) -> Op:
    return Op(type="info", f=inv.f, process=inv.process, time=time, value=inv.value,
              txn=inv.txn, error=why)


def complete_pending(ops: Sequence[Op]) -> list[Op]:
    """The ops with an ``info`` completion for every invoke that has none: right before the
    process's ``crash`` op if it has one, else at the end of the history."""
    out: list[Op] = []
    pending: dict[str, Op] = {}
    last_time = max((op.time for op in ops if op.time is not None), default=None)
    for op in ops:
        if op.process is not None and not op.is_meta:
            if op.is_invoke:
                pending[op.process] = op
            elif op.f == "crash":
                inv = pending.pop(op.process, None)
                if inv is not None:
                    out.append(_synthetic_info(inv, op.time, "crashed during the operation"))
            else:
                pending.pop(op.process, None)
        out.append(op)
    for inv in pending.values():
        out.append(_synthetic_info(inv, last_time, "no completion (the process was killed)"))
    return out


def pairs(ops: Iterable[Op]) -> list[tuple[Op, Op | None]]:
    """Each invoke with its completion (None if it has none), in the order of the invokes: for
    latencies (completion time - invoke time) and throughput over time."""
    out: list[tuple[Op, Op | None]] = []
    pending: dict[str, int] = {}
    for op in ops:
        if op.is_meta or op.process is None:
            continue
        if op.is_invoke:
            pending[op.process] = len(out)
            out.append((op, None))
        elif op.f != "crash" or op.process in pending:
            at = pending.pop(op.process, None)
            if at is not None:
                out[at] = (out[at][0], op)
    return out


def merge(paths: Iterable[str | os.PathLike[str]]) -> list[Op]:
    """The per-process files merged into one history: the workload meta first, then every line
    by time (a line without a time keeps its place after the line before it in its file),
    invokes without completion completed with ``info``, and ``index`` set to the position."""
    metas: list[Op] = []
    rows: list[tuple[int, int, int, Op]] = []
    for fileno, path in enumerate(paths):
        lines = list(_read_lines(path))
        _check_sequence(lines, path)
        t = 0
        for lineno, op in lines:
            if op.is_meta and op.f is None:
                if metas and metas[0].extra != op.extra:
                    raise HistoryError(f"{path}:{lineno}: a workload meta line that differs "
                                       f"from the one seen first ({metas[0].extra})")
                if not metas:
                    metas.append(op)
                continue
            if op.time is not None:
                t = op.time
            rows.append((t, fileno, lineno, op))
    rows.sort(key=lambda r: r[:3])
    ops = complete_pending(metas + [r[3] for r in rows])
    for i, op in enumerate(ops):
        op.index = i
    return ops


def save(path: str | os.PathLike[str], ops: Iterable[Op]) -> None:
    """Writes a history as JSON lines."""
    with open(Path(path), "w", encoding="utf-8") as file:
        file.writelines(json.dumps(op.to_dict(), separators=(",", ":")) + "\n" for op in ops)

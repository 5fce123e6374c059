"""Jepsen's Kafka checks over a queue history (``verify/queue_history.py``).

The definitions are those of Jepsen's Kafka workload (``jepsen.tests.kafka``, which builds on Elle
for the cycles); this is an implementation of our own. From every offset any operation observed
(every poll, whatever the operation's outcome, and the sends of operations that must have
committed) it builds, per key, the *version order*: the values in offset order, gaps removed
(transaction markers take offsets). Then:

- ``inconsistent-offsets``: one offset of a key seen holding different values.
- ``duplicate``: one value at more than one offset of a key.
- ``lost-write``: an acknowledged value that no successful poll read, although a successful poll
  read a value later in the same key (so it should have passed it).
- ``unseen``: an acknowledged value that no successful poll read at all, in a key the final drain
  read to its end (the ``drain_end`` meta line; without it this check is off).
- ``G1a``: a value read whose send (or transaction) failed: an aborted read (by any operation,
  whatever its own outcome: read_committed consumers never see aborted records).
- ``precommitted-read``: an operation that read a value it sent itself (read_committed consumers
  never see uncommitted records, not even their own).
- ``int-poll-skip`` / ``int-nonmonotonic-poll``: two successive values one operation read from a
  key are not neighbours in the version order: it skipped values / went back (or repeated). Keys
  a rebalance moved during the operation (its optional ``rebalance_log``, a list of
  ``{"keys": [...]}`` as in Jepsen's workload) are not judged.
- ``poll-skip`` / ``nonmonotonic-poll``: the same between a process's successive successful reads
  of a key (a failed operation's reads do not move the expected position: a consumer rewinds after
  an abort; an indeterminate one's may or may not). ``assign``, ``subscribe`` and ``crash`` reset
  the process's expectations.
- ``int-send-skip`` / ``int-nonmonotonic-send``, ``send-skip`` / ``nonmonotonic-send``: the same
  for the values one operation, and one process in successive operations, sent to a key.
- ``G0``: a cycle of write-write (ww) dependencies between operations: T1 ww T2 when T1 sent a
  value to a key directly before a value T2 sent, in the version order. ``G1c``: a cycle of ww and
  write-read (wr: T2 read a value T1 sent) dependencies with at least one wr edge.
- ``lost-copy`` / ``duplicate-copy`` (copier and Spark workloads, the meta ``copies`` map): a
  committed input value (read by a successful poll of an input key) missing from its output key,
  which the final drain read to its end / present there at more than one offset.

Some of these are legal in Kafka's transaction model, as Jepsen's checker also judges
(``allowed-error-types``): writes are not isolated, so the sends of concurrent producers
interleave (``int-send-skip``, ``send-skip``) and their ww dependencies may form cycles (``G0``,
and ``G1c`` cycles that include a ww edge). A ``G1c`` of wr edges alone is an anomaly: each
operation read what the other sent, so each committed before the other. Under ``subscribe`` the
group may move partitions between polls: ``poll-skip`` and ``nonmonotonic-poll`` are then legal.
Those findings are kept (``QueueVerdict.allowed``) and do not count as anomalies.

An indeterminate (``info``) operation is never judged lost, unseen or a source of aborted reads
unless the history proves it committed (a successful poll read one of the values its transaction
sent); for a non-transactional ``info`` send, only that send's own value read proves it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .queue_history import MOP_FS, Op, drain_end, history_meta

ANOMALIES = (
    "lost-write", "unseen", "duplicate", "inconsistent-offsets", "G1a", "precommitted-read",
    "G0", "G1c",
    "int-poll-skip", "int-nonmonotonic-poll", "poll-skip", "nonmonotonic-poll",
    "int-send-skip", "int-nonmonotonic-send", "send-skip", "nonmonotonic-send",
    "lost-copy", "duplicate-copy",
)

DESCRIPTIONS = {
    "lost-write": "acknowledged, never read, a later offset was",
    "unseen": "acknowledged, not read by the final drain",
    "duplicate": "one value at two offsets of a key",
    "inconsistent-offsets": "one offset seen with two values",
    "G1a": "read a value whose send/txn failed",
    "precommitted-read": "an op read its own (uncommitted) send",
    "G0": "write cycle (ww)",
    "G1c": "cycle of ww and wr, with a wr edge",
    "int-poll-skip": "one op's reads skipped values",
    "int-nonmonotonic-poll": "one op's reads went back",
    "poll-skip": "a process's next read skipped values",
    "nonmonotonic-poll": "a process's next read went back",
    "int-send-skip": "one op's sends not adjacent",
    "int-nonmonotonic-send": "one op's sends out of order",
    "send-skip": "a process's next send not adjacent",
    "nonmonotonic-send": "a process's next send went back",
    "lost-copy": "committed input value not in its output",
    "duplicate-copy": "input value copied more than once",
}

# Always legal in Kafka's model (writes are not isolated); G1c with a ww edge, and poll-skip /
# nonmonotonic-poll under subscribe, are judged per finding.
ALWAYS_ALLOWED = frozenset({"G0", "int-send-skip", "send-skip"})

MAX_EXAMPLES = 5
KEEP_ALLOWED = 20  # permitted findings kept per name (all are counted)
_MAX_SHOWN = 4  # values listed in one explanation


@dataclass
class Anomaly:
    """One finding: its name, the indices of the fewest ops that show it, one line of why."""

    name: str
    ops: list[int]
    explanation: str
    keys: tuple[str, ...] = ()
    values: list[int] = field(default_factory=list)
    allowed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ops": list(self.ops), "explanation": self.explanation,
                "keys": list(self.keys), "values": list(self.values), "allowed": self.allowed}


@dataclass
class QueueVerdict:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    # completion index -> its invoke's index, for the ops anomalies name (excerpts)
    invokes: dict[int, int] = field(default_factory=dict, repr=False)
    # how many permitted findings there were (only KEEP_ALLOWED of each are in anomalies)
    allowed_counts: dict[str, int] | None = None

    @property
    def counts(self) -> dict[str, int]:
        """Every anomaly name with how many findings count against the history (zero too)."""
        c = dict.fromkeys(ANOMALIES, 0)
        for a in self.anomalies:
            if not a.allowed:
                c[a.name] += 1
        return c

    @property
    def allowed(self) -> dict[str, int]:
        """Every anomaly name with how many findings Kafka's model permits."""
        c = dict.fromkeys(ANOMALIES, 0)
        if self.allowed_counts is not None:
            c.update(self.allowed_counts)
            return c
        for a in self.anomalies:
            if a.allowed:
                c[a.name] += 1
        return c

    @property
    def anomaly_count(self) -> int:
        return sum(1 for a in self.anomalies if not a.allowed)

    @property
    def ok(self) -> bool:
        return self.anomaly_count == 0

    def of(self, name: str, allowed: bool | None = None) -> list[Anomaly]:
        return [a for a in self.anomalies
                if a.name == name and (allowed is None or a.allowed == allowed)]

    def as_dict(self, max_allowed: int = 20) -> dict[str, Any]:
        """Every anomaly that counts, and up to ``max_allowed`` permitted findings per name."""
        shown: dict[str, int] = {}
        listed = []
        for a in self.anomalies:
            if a.allowed:
                shown[a.name] = shown.get(a.name, 0) + 1
                if shown[a.name] > max_allowed:
                    continue
            listed.append(a.as_dict())
        return {"ok": self.ok, "anomalies_total": self.anomaly_count, "counts": self.counts,
                "allowed": self.allowed, "anomalies": listed, "stats": dict(self.stats)}

    def table(self) -> str:
        """The verdict as text: a line per anomaly (count, permitted findings), a few examples."""
        counts, allowed = self.counts, self.allowed
        lines = ["anomaly                count  allowed  meaning"]
        for a in ANOMALIES:
            lines.append(f"{a:<22} {counts[a]:>5}  {allowed[a]:>7}  {DESCRIPTIONS[a]}")
        for name in ANOMALIES:
            for an in self.of(name, allowed=False)[:MAX_EXAMPLES]:
                lines.append(f"  {name}: {an.explanation} [ops {_ops_text(an.ops)}]")
        lines.append("history: " + ", ".join(f"{k} {v}" for k, v in self.stats.items()))
        lines.append("verdict: " + ("OK, no anomalies" if self.ok else
                                    f"{self.anomaly_count} anomalies"))
        return "\n".join(lines)


def _ops_text(ops: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ops)


# -- the operations, parsed once ---------------------------------------------------------------

Pairs = Sequence[Sequence[Any]]  # [(offset or None, value), ...]; a read's offset may be -1


class _Done:
    """A completed send / poll / txn op (or an invoke without completion, as ``info``)."""

    __slots__ = ("f", "index", "node", "process", "rank", "reads", "rebalanced", "synthetic",
                 "txn", "type", "writes")

    def __init__(self, index: int, type_: str, f: str, process: str, txn: bool, value: Any,
                 synthetic: bool = False) -> None:
        self.index = index
        self.node = -1  # position among the ops judged (the dependency graph's node)
        self.rebalanced: frozenset[str] = frozenset()  # keys a rebalance moved during the op
        self.type = type_
        self.f = f
        self.process = process
        self.txn = txn
        self.synthetic = synthetic
        self.reads: dict[str, Pairs] = {}
        self.writes: dict[str, list[tuple[int | None, int]]] = {}
        self.rank = 0  # 3 ok, 2 info proven committed, 1 info, 0 fail
        reads = self.reads
        writes = self.writes
        for mop in value or ():
            if mop[0] == "send":
                k, v = mop[1], mop[2]
                if v.__class__ is list:
                    off = v[0]
                    pair = (off if off is not None and off >= 0 else None, v[1])
                else:
                    pair = (None, v)
                w = writes.get(k)
                if w is None:
                    writes[k] = [pair]
                else:
                    w.append(pair)
            elif len(mop) > 1:
                for k, pairs in mop[1].items():
                    if pairs:  # [offset, value] lists as recorded (offset None or -1: unknown)
                        r = reads.get(k)
                        reads[k] = pairs if r is None else r + pairs

    def __repr__(self) -> str:
        return f"op {self.index} ({self.process} {self.type} {self.f})"


class _Reset:
    __slots__ = ("index", "mode")

    def __init__(self, index: int, mode: str | None) -> None:
        self.index = index
        self.mode = mode


class _Order:
    """A key's version order: its offsets in order, gaps removed (index = dense offset)."""

    __slots__ = ("first", "last", "offsets", "values")

    def __init__(self, log: dict[int, int], conflicts: dict[int, set[int]]) -> None:
        self.offsets = sorted(log)
        self.values: list[list[int]] = []  # values seen at each index (more than one: conflict)
        self.first: dict[int, int] = {}  # value -> first index it appears at
        self.last: dict[int, int] = {}  # value -> last index (Jepsen's by-value)
        for i, off in enumerate(self.offsets):
            vs = sorted(conflicts[off]) if off in conflicts else [log[off]]
            self.values.append(vs)
            for v in vs:
                self.first.setdefault(v, i)
                self.last[v] = i


def _parse(ops: Sequence[Op]) -> tuple[list[_Done], dict[str, list[_Done | _Reset]],
                                       dict[int, int], dict[str, int]]:
    dones: list[_Done] = []
    by_process: dict[str, list[_Done | _Reset]] = {}
    invokes: dict[int, int] = {}
    pending: dict[str, Op] = {}
    stats = {"ops": 0, "sends": 0, "polls": 0, "records_read": 0, "txns_ok": 0,
             "txns_fail": 0, "txns_info": 0}

    def finish(inv: Op, type_: str, index: int, value: Any, synthetic: bool) -> None:
        assert inv.f is not None and inv.process is not None
        d = _Done(index, type_, inv.f, inv.process, inv.txn, value, synthetic)
        d.node = len(dones)
        dones.append(d)
        by_process.setdefault(inv.process, []).append(d)
        if inv.txn:
            stats[f"txns_{type_}"] += 1
        stats["records_read"] += sum(len(p) for p in d.reads.values())

    for op in ops:
        index = op.index
        if op.is_meta or op.process is None:
            continue
        if op.is_invoke or op.f == "crash":
            stats["ops"] += 1
        if op.is_invoke:
            stale = pending.pop(op.process, None)
            if stale is not None and stale.f in MOP_FS:
                finish(stale, "info", stale.index, stale.value, True)
            pending[op.process] = op
            if op.f in MOP_FS:
                for mop in op.value:
                    stats["sends" if mop[0] == "send" else "polls"] += 1
            continue
        if op.f == "crash":
            inv = pending.pop(op.process, None)
            if inv is not None and inv.f in MOP_FS:
                finish(inv, "info", inv.index, inv.value, True)
            by_process.setdefault(op.process, []).append(_Reset(index, None))
            continue
        inv = pending.pop(op.process, None)
        if inv is None:
            continue  # load() rejects this; a hand-made list may have it: nothing to judge
        invokes[index] = inv.index
        if op.f in MOP_FS:
            finish(inv, op.type, index, op.value if op.value is not None else inv.value, False)
            log = op.extra.get("rebalance_log")
            if isinstance(log, list):
                dones[-1].rebalanced = frozenset(
                    k for e in log if isinstance(e, dict) for k in e.get("keys", ()))
        elif op.f in ("assign", "subscribe") and op.type in ("ok", "info"):
            by_process.setdefault(op.process, []).append(_Reset(index, op.f))
    for inv in pending.values():
        if inv.f in MOP_FS:
            finish(inv, "info", inv.index, inv.value, True)
    return dones, by_process, invokes, stats


# -- the checker -----------------------------------------------------------------------------------


def check_queue(ops: Sequence[Op], copier_caught_up: bool = True) -> QueueVerdict:
    """Jepsen's Kafka checks over a queue history (in history order, as :func:`merge` makes it).

    ``copier_caught_up``: the copiers copied all of their input before they stopped, so every
    committed input value must be in its output (else a missing value counts only when a later
    input value of the same key was copied)."""
    if any(op.index < 0 for op in ops):
        ops = [op if op.index >= 0 else dataclasses.replace(op, index=pos)
               for pos, op in enumerate(ops)]
    dones, by_process, invokes, stats = _parse(ops)
    stats["processes"] = len(by_process)
    meta = history_meta(ops)
    drain = drain_end(ops)
    out: list[Anomaly] = []

    permitted = dict.fromkeys(ANOMALIES, 0)

    def add(name: str, at: Iterable[int], why: str,
            keys: Iterable[str] = (), values: Iterable[int] = (), allowed: bool = False) -> None:
        allowed = allowed or name in ALWAYS_ALLOWED
        if allowed:
            permitted[name] += 1
            if permitted[name] > KEEP_ALLOWED:
                return  # counted; legal in Kafka's model, and there may be very many
        out.append(Anomaly(name, sorted(set(at)), why, tuple(keys), list(values), allowed))

    # What successful polls read: key -> value -> the first op that read it.
    ok_read: dict[str, dict[int, _Done]] = {}
    for d in dones:
        if d.type == "ok":
            for k, pairs in d.reads.items():
                kr = ok_read.setdefault(k, {})
                for _, v in pairs:
                    kr.setdefault(v, d)

    def write_committed(d: _Done, k: str, v: int) -> bool:
        if d.rank >= 2:
            return True
        return d.type == "info" and not d.txn and v in ok_read.get(k, {})

    # Which ops must have committed; the writer of each value (the surest one if several).
    writer: dict[str, dict[int, _Done]] = {}
    for d in dones:
        if d.type == "ok":
            d.rank = 3
        elif d.type == "info":
            d.rank = 2 if d.txn and any(v in ok_read.get(k, {})
                                        for k, pairs in d.writes.items()
                                        for _, v in pairs) else 1
        for k, pairs in d.writes.items():
            kw = writer.setdefault(k, {})
            for _, v in pairs:
                cur = kw.get(v)
                if cur is None or d.rank > cur.rank:
                    kw[v] = d

    # The logs: key -> offset -> value, and the offsets seen with more than one value.
    logs: dict[str, dict[int, int]] = {}
    conflicts: dict[str, dict[int, set[int]]] = {}

    def observe(k: str, pairs: Pairs) -> None:
        log = logs.setdefault(k, {})
        for off, v in pairs:
            if off is None or off < 0:
                continue
            cur = log.get(off)
            if cur is None:
                log[off] = v
            elif cur != v:
                conflicts.setdefault(k, {}).setdefault(off, {cur}).add(v)

    for d in dones:
        for k, pairs in d.reads.items():
            observe(k, pairs)
        for k, pairs in d.writes.items():
            observe(k, [(o, v) for o, v in pairs if write_committed(d, k, v)])
    orders = {k: _Order(log, conflicts.get(k, {})) for k, log in logs.items()}
    keys = set(logs) | set(writer) | set(meta.keys)
    stats["keys"] = len(keys)

    def witnesses(wanted: set[tuple[str, int]]) -> dict[tuple[str, int], dict[int, _Done]]:
        """For each (key, value): offset -> the first op that saw the value there."""
        found: dict[tuple[str, int], dict[int, _Done]] = {kv: {} for kv in wanted}
        for d in dones:
            for k, pairs in d.reads.items():
                for off, v in pairs:
                    if off is not None and off >= 0 and (k, v) in found:
                        found[(k, v)].setdefault(off, d)
            for k, pairs in d.writes.items():
                for off, v in pairs:
                    if off is not None and (k, v) in found and write_committed(d, k, v):
                        found[(k, v)].setdefault(off, d)
        return found

    # -- inconsistent offsets, duplicates --------------------------------------------------------
    copies = meta.copies
    copy_inputs: dict[str, set[int]] = {}
    for in_k, out_k in copies.items():
        copy_inputs.setdefault(out_k, set()).update(ok_read.get(in_k, {}))
    dups: list[tuple[str, int, list[int]]] = []
    for k, order in orders.items():
        seen_at: dict[int, list[int]] = {}
        for i, vs in enumerate(order.values):
            for v in vs:
                if order.first[v] != order.last[v]:
                    seen_at.setdefault(v, []).append(order.offsets[i])
        dups.extend((k, v, offs) for v, offs in seen_at.items())
    wanted = {(k, v) for k, v, _ in dups}
    wanted |= {(k, v) for k, c in conflicts.items() for vs in c.values() for v in vs}
    wit = witnesses(wanted) if wanted else {}
    for k, c in conflicts.items():
        for off, held in sorted(c.items()):
            at = [wit[(k, v)][off].index for v in sorted(held)]
            add("inconsistent-offsets", at, f"{k} offset {off} seen holding "
                f"{' and '.join(str(v) for v in sorted(held))}", [k], sorted(held))
    for k, v, offs in dups:
        at = [wit[(k, v)][off].index for off in offs]
        where = ", ".join(str(o) for o in offs)
        if v in copy_inputs.get(k, ()):
            in_k = next(i for i, o in copies.items() if o == k and v in ok_read.get(i, {}))
            reader = ok_read[in_k][v]
            add("duplicate-copy", [*at, reader.index], f"input {in_k} value {v} (read by op "
                f"{reader.index}) is in its output {k} {len(offs)} times, at offsets {where}",
                [in_k, k], [v])
        else:
            add("duplicate", at, f"{k} value {v} at offsets {where}", [k], [v])

    # -- lost writes (Jepsen's definition) and unseen writes --------------------------------------
    lost: set[tuple[str, int]] = set()
    for k, reads in ok_read.items():
        k_order = orders.get(k)
        if k_order is None:
            continue
        order = k_order
        bound = max((order.first[v] for v in reads if v in order.first), default=-1)
        if bound < 0:
            continue
        top = next(v for v in order.values[bound] if v in reads)
        top_reader = reads[top]
        for i in range(bound + 1):
            for v in order.values[i]:
                if v in reads or order.last[v] > bound:
                    continue
                w = writer.get(k, {}).get(v)
                if w is None or w.rank < 2:
                    continue
                lost.add((k, v))
                add("lost-write", [w.index, top_reader.index], f"{k} value {v} at offset "
                    f"{order.offsets[i]}, sent by op {w.index} ({w.type}), was never read, "
                    f"though op {top_reader.index} read {k} up to offset "
                    f"{order.offsets[bound]} (value {top})", [k], [v])
    drained: dict[str, dict[str, int]] = drain.value if drain is not None else {}
    if drain is not None:
        for d in dones:
            if d.rank < 2:
                continue
            for k, pairs in d.writes.items():
                end = drained.get(k)
                if end is None:
                    continue
                complete = end["reached"] >= end["end"]
                for w_off, v in pairs:
                    if v in ok_read.get(k, {}) or (k, v) in lost:
                        continue
                    if complete or (w_off is not None and w_off < end["reached"]):
                        add("unseen", [d.index, drain.index], f"{k} value {v} (offset "
                            f"{'?' if w_off is None else w_off}) acknowledged by op {d.index} "
                            f"({d.type}) was read by no poll; the final drain read {k} to "
                            f"offset {end['reached']} (end {end['end']})", [k], [v])
        stats["drain_incomplete_keys"] = sum(1 for e in drained.values()
                                             if e["reached"] < e["end"])

    # -- aborted reads, precommitted reads -------------------------------------------------------
    g1a: set[tuple[str, int]] = set()
    failed: dict[str, dict[int, _Done]] = {}  # values only failed ops sent
    for k, kw in writer.items():
        for v, w in kw.items():
            if w.type == "fail":
                failed.setdefault(k, {})[v] = w
    for d in dones:
        for k, pairs in d.reads.items() if failed else ():
            k_failed = failed.get(k)
            if k_failed is None:
                continue
            for r_off, v in pairs:
                w = k_failed.get(v)
                if w is not None and (k, v) not in g1a:
                    g1a.add((k, v))
                    add("G1a", [w.index, d.index], f"op {d.index} ({d.type}) read {k} value "
                        f"{v} (offset {r_off}), which op {w.index} sent and failed", [k], [v])
        if d.reads and d.writes:
            for k, pairs in d.writes.items():
                mine = {v for _, v in pairs}
                bad = [v for _, v in d.reads.get(k, ()) if v in mine]
                if bad:
                    add("precommitted-read", [d.index], f"op {d.index} ({d.type}) read "
                        f"{k} value {bad[0]}, which it sent itself in the same transaction",
                        [k], bad[:1])

    # -- internal skips and inversions -----------------------------------------------------------
    def internal(d: _Done, pairs_by_key: Mapping[str, Pairs], skip: str, back: str,
                 what: str) -> None:
        for k, pairs in pairs_by_key.items():
            order = orders.get(k)
            if order is None or len(pairs) < 2 or k in d.rebalanced:
                continue
            last = order.last
            for (_, v1), (_, v2) in itertools.pairwise(pairs):
                i1, i2 = last.get(v1), last.get(v2)
                if i1 is None or i2 is None:
                    continue
                delta = i2 - i1
                if delta > 1:
                    add(skip, [d.index], f"op {d.index} {what} {k} value {v1} then "
                        f"{v2}, skipping {delta - 1} ({_skipped(order, i1, i2)})",
                        [k], [v1, v2])
                elif delta < 1:
                    add(back, [d.index], f"op {d.index} {what} {k} value {v1} then {v2}, "
                        f"{-delta + 1} back in the log", [k], [v1, v2])

    for d in dones:
        if d.reads and any(len(p) > 1 for p in d.reads.values()):
            internal(d, d.reads, "int-poll-skip", "int-nonmonotonic-poll", "read")
        if d.writes and any(len(p) > 1 for p in d.writes.values()):
            internal(d, d.writes, "int-send-skip", "int-nonmonotonic-send", "sent")

    # -- per process: external skips and inversions ----------------------------------------------
    for events in by_process.values():
        _external(events, orders, add)

    # -- cycles ------------------------------------------------------------------------------------
    _cycles(dones, orders, writer, add)

    # -- copies -------------------------------------------------------------------------------------
    for in_k, out_k in copies.items():
        inputs = ok_read.get(in_k, {})
        end = drained.get(out_k)
        if not inputs or end is None or end["reached"] < end["end"]:
            continue
        out_order = orders.get(out_k)
        copied = set(out_order.first) if out_order else set()
        in_order = orders.get(in_k)
        horizon = None
        if not copier_caught_up and in_order is not None:
            horizon = max((in_order.first[v] for v in copied if v in in_order.first),
                          default=-1)
        for v, reader in inputs.items():
            if v in copied:
                continue
            if horizon is not None and (in_order is None or in_order.first.get(v, 1 << 62)
                                        > horizon):
                continue
            add("lost-copy", [reader.index] + ([drain.index] if drain else []),
                f"input {in_k} value {v} (read by op {reader.index}) is not in its output "
                f"{out_k}, which the final drain read to offset {end['reached']}",
                [in_k, out_k], [v])

    stats["anomalies"] = sum(1 for a in out if not a.allowed)
    referenced = {i for a in out for i in a.ops}
    verdict = QueueVerdict(out, stats, {c: i for c, i in invokes.items() if c in referenced},
                           permitted)
    return verdict


def _skipped(order: _Order, i1: int, i2: int) -> str:
    text = ", ".join(str(order.values[i][0]) for i in range(i1 + 1, min(i2, i1 + 1 + _MAX_SHOWN)))
    return text + (", ..." if i2 - i1 - 1 > _MAX_SHOWN else "")


Add = Callable[..., None]


def _external(events: list[_Done | _Reset], orders: dict[str, _Order], add: Add) -> None:
    """A process's successive polls and sends of a key must continue where the last left."""
    mode: str | None = None
    last_poll: dict[str, tuple[int, _Done, int]] = {}  # key -> (index, op, value)
    info_polls: dict[str, list[tuple[int, _Done, int]]] = {}
    last_send: dict[str, tuple[int, _Done, int]] = {}
    for ev in events:
        if isinstance(ev, _Reset):
            mode = ev.mode
            last_poll.clear()
            info_polls.clear()
            last_send.clear()
            continue
        d = ev
        for k, pairs in d.reads.items():
            order = orders.get(k)
            if order is None:
                continue
            by_value = order.last
            v2 = pairs[0][1]
            i2 = by_value.get(v2)
            prev_ok = last_poll.get(k)
            if prev_ok is None or (i2 is not None and i2 - prev_ok[0] == 1):
                # no successful read since the last reset (where an indeterminate op's reads,
                # if it did not commit, leave no expectation), or it went on where it left off
                cands = []
            else:
                cands = [prev_ok, *info_polls.get(k, ())]
            if i2 is not None and cands:
                deltas = [(i2 - c[0], c) for c in cands]
                if not any(delta == 1 for delta, _ in deltas):
                    below = [dc for dc in deltas if dc[0] > 1]
                    if below:
                        delta, (i1, prev, v1) = min(below, key=lambda dc: dc[0])
                        add("poll-skip", [prev.index, d.index], f"{d.process}: op "
                            f"{d.index} read {k} from value {v2}, but its last read, op "
                            f"{prev.index}, ended at {v1}: {delta - 1} skipped "
                            f"({_skipped(order, i1, i2)})",
                            [k], [v1, v2], allowed=mode == "subscribe")
                    else:
                        delta, (i1, prev, v1) = deltas[0]
                        add("nonmonotonic-poll", [prev.index, d.index], f"{d.process}: op "
                            f"{d.index} read {k} from value {v2}, but its last read, op "
                            f"{prev.index}, ended at {v1}: {-delta + 1} back",
                            [k], [v1, v2], allowed=mode == "subscribe")
            v_end = pairs[-1][1]
            i_end = by_value.get(v_end)
            if d.type == "ok":
                info_polls.pop(k, None)
                if i_end is None:
                    last_poll.pop(k, None)
                else:
                    last_poll[k] = (i_end, d, v_end)
            elif d.type == "info" and i_end is not None:
                info_polls.setdefault(k, []).append((i_end, d, v_end))
        if d.type not in ("ok", "info"):
            continue
        for k, pairs in d.writes.items():
            order = orders.get(k)
            if order is None:
                continue
            v2 = pairs[0][1]
            i2 = order.last.get(v2)
            prev_send = last_send.get(k)
            if i2 is not None and prev_send is not None:
                i1, prev, v1 = prev_send
                if i2 - i1 < 1:
                    add("nonmonotonic-send", [prev.index, d.index], f"{d.process}: op "
                        f"{d.index} sent {k} value {v2}, {i1 - i2 + 1} before value {v1} its "
                        f"op {prev.index} sent earlier", [k], [v1, v2])
                elif i2 - i1 > 1:
                    add("send-skip", [prev.index, d.index], f"{d.process}: op "
                        f"{d.index} sent {k} value {v2}, {i2 - i1 - 1} after value {v1} of its "
                        f"op {prev.index}", [k], [v1, v2])
            for _, v in reversed(pairs):
                i_end = order.last.get(v)
                if i_end is not None:
                    last_send[k] = (i_end, d, v)
                    break


# -- dependency cycles (G0, G1c) ---------------------------------------------------------------


Adjacency = list[list[int]]  # node (position in the list of ops judged) -> successors


def _cycles(dones: list[_Done], orders: dict[str, _Order],
            writer: dict[str, dict[int, _Done]], add: Add) -> None:
    n = len(dones)
    ww: Adjacency = [[] for _ in range(n)]
    wr: Adjacency = [[] for _ in range(n)]
    for k, order in orders.items():
        kw = writer.get(k)
        if not kw:
            continue
        prev_w: _Done | None = None
        for vs in order.values:
            w = kw.get(vs[0])
            if w is not None and prev_w is not None and w is not prev_w:
                ww[prev_w.node].append(w.node)
            prev_w = w
    for b, d in enumerate(dones):
        for k, pairs in d.reads.items():
            kw = writer.get(k)
            if kw is None:
                continue
            last_w = None
            for _, v in pairs:
                w = kw.get(v)
                if w is last_w:
                    continue
                last_w = w
                if w is not None and w is not d:
                    wr[w.node].append(b)

    def ww_reason(a: _Done, b: _Done) -> tuple[str, str]:
        for k, pairs in b.writes.items():
            order = orders.get(k)
            if order is None or k not in a.writes:
                continue
            for _, v2 in pairs:
                i = order.last.get(v2)
                if i:
                    v1 = order.values[i - 1][0]
                    if writer[k].get(v1) is a:
                        return f"-ww({k} {v1}<{v2})->", k
        # (a value at two offsets: the edge came from its other one)
        return "-ww->", next((k for k in b.writes if k in a.writes), "")

    def wr_reason(a: _Done, b: _Done) -> tuple[str, str]:
        for k, pairs in b.reads.items():
            kw = writer.get(k, {})
            for _, v in pairs:
                if kw.get(v) is a:
                    return f"-wr({k} {v})->", k
        return "-wr->", ""

    def describe(cycle: list[int], prefer_wr: bool) -> tuple[str, list[str]]:
        """The cycle as text (each edge with its key and values), and the keys of its edges."""
        parts = [str(dones[cycle[0]].index)]
        keys: list[str] = []
        for a, b in itertools.pairwise([*cycle, cycle[0]]):
            use_wr = b in wr[a] and (prefer_wr or b not in ww[a])
            text, k = (wr_reason if use_wr else ww_reason)(dones[a], dones[b])
            parts += [text, str(dones[b].index)]
            if k and k not in keys:
                keys.append(k)
        return "op " + " ".join(parts), keys

    def indices(cycle: list[int]) -> list[int]:
        return [dones[i].index for i in cycle]

    def backward(adj: Adjacency) -> bool:
        # a cycle needs an edge to an op earlier in the history than its source
        return any(b < a for a, succ in enumerate(adj) for b in succ)

    # G0: write cycles.
    if backward(ww):
        for comp in _sccs(ww):
            cyc = _find_cycle(comp, [ww], comp[0], comp[0])
            text, keys = describe(cyc, False)
            add("G0", indices(cyc), "write cycle: " + text, keys)
    # G1c of wr edges alone: each op read what another sent, round to itself.
    bad_nodes: set[int] = set()
    if backward(wr):
        for comp in _sccs(wr):
            bad_nodes.update(comp)
            cyc = _find_cycle(comp, [wr], comp[0], comp[0])
            text, keys = describe(cyc, True)
            add("G1c", indices(cyc), "read cycle: " + text + " (each committed before the "
                "other read it)", keys)
    # G1c with ww edges: legal in Kafka's model (writes are not isolated): permitted.
    if not backward(ww) and not backward(wr):
        return
    combined: Adjacency = [a + b for a, b in zip(ww, wr, strict=True)]
    for comp in _sccs(combined):
        members = set(comp)
        if members & bad_nodes:
            continue
        edge = next(((a, b) for a in comp for b in wr[a] if b in members), None)
        if edge is None:
            continue  # a ww cycle only: reported as G0
        a, b = edge
        cyc = _find_cycle(comp, [ww, wr], b, a)  # b ... a, and a -wr-> b closes it
        text, keys = describe(cyc, True)
        add("G1c", indices(cyc), "cycle: " + text, keys, allowed=True)


def _sccs(adj: Adjacency) -> list[list[int]]:
    """Tarjan's strongly connected components (of more than one node), iteratively."""
    n = len(adj)
    index = [-1] * n
    low = [0] * n
    on_stack = bytearray(n)
    stack: list[int] = []
    found: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] >= 0 or not adj[root]:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = 1
        work = [(root, 0)]
        while work:
            v, i = work[-1]
            succ = adj[v]
            descended = False
            while i < len(succ):
                w = succ[i]
                i += 1
                if index[w] < 0:
                    work[-1] = (v, i)
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = 1
                    work.append((w, 0))
                    descended = True
                    break
                if on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
            if descended:
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = 0
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comp.sort()
                    found.append(comp)
    return found


def _find_cycle(comp: list[int], graphs: list[Adjacency], start: int, goal: int) -> list[int]:
    """The shortest path start -> ... -> goal inside the component (breadth first): the nodes
    from start to the one before goal when start == goal (a cycle), else start .. goal."""
    members = set(comp)
    parent: dict[int, int] = {}
    queue = deque([start])
    seen = {start} if start != goal else set()
    while queue:
        a = queue.popleft()
        for g in graphs:
            for b in g[a]:
                if b not in members or b in seen:
                    continue
                seen.add(b)
                parent[b] = a
                if b == goal:
                    path = [b]
                    while path[-1] != start or (start == goal and len(path) == 1):
                        path.append(parent[path[-1]])
                    path.reverse()
                    return path[:-1] if start == goal else path
                queue.append(b)
    raise AssertionError("no cycle in a strongly connected component")


# -- excerpts ------------------------------------------------------------------------------------


def excerpt(verdict: QueueVerdict, ops: Sequence[Op], anomaly: Anomaly) -> list[Op]:
    """The ops that show an anomaly, with their invokes, in history order; their micro-ops
    trimmed to the anomaly's keys."""
    by_index = {op.index if op.index >= 0 else pos: op for pos, op in enumerate(ops)}
    # (check_queue numbers ops by position when they have no index; so does this)
    wanted: set[int] = set()
    for i in anomaly.ops:
        wanted.add(i)
        if i in verdict.invokes:
            wanted.add(verdict.invokes[i])
    keys = set(anomaly.keys)
    shown = []
    for i in sorted(wanted):
        op = by_index.get(i)
        if op is None:
            continue
        if keys and op.f in MOP_FS and isinstance(op.value, list):
            op = dataclasses.replace(op, value=_trim(op.value, keys))
        shown.append(op)
    return shown


def _trim(value: list[Any], keys: set[str]) -> list[Any]:
    trimmed: list[Any] = []
    for mop in value:
        if mop[0] == "send":
            if mop[1] in keys:
                trimmed.append(mop)
        elif len(mop) > 1:
            polled = {k: pairs for k, pairs in mop[1].items() if k in keys}
            if polled:
                trimmed.append(["poll", polled])
        else:
            trimmed.append(mop)
    return trimmed

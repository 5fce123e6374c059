"""The history checker: a pure function from a history to a verdict.

Anomalies (each counted once per value, transaction, reader or partition it concerns):

- ``lost_write``: a record of a committed transaction (commit returned; the send not reported
  as failed) that no reader read, although readers read its partition.
- ``duplicate``: the same value read at two different positions (partition, offset).
- ``aborted_read``: a value read whose transaction aborted, never ended, whose send was reported
  failed, or that no writer wrote at all.
- ``torn_transaction``: a committed or indeterminate transaction of which some records were
  read and others were not (a transaction is all or nothing).
- ``non_monotonic``: a reader saw an offset of a partition that was not above the previous one
  it saw there, without seeking in between.
- ``stuck_read``: a reader could not read a partition to its end (the high watermark) before it
  gave up: with read_committed, an open transaction that nobody will end (a hanging
  transaction) holds the last stable offset back forever.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .history import Op, Read, ReaderEnd, Seek, Txn, Write

ANOMALIES = ("lost_write", "duplicate", "aborted_read", "torn_transaction", "non_monotonic",
             "stuck_read")

DESCRIPTIONS = {
    "lost_write": "committed, never read",
    "duplicate": "read at two positions",
    "aborted_read": "read, but aborted / never committed / failed",
    "torn_transaction": "transaction partly visible",
    "non_monotonic": "offsets went backwards or repeated",
    "stuck_read": "reader could not read to the end (hanging transaction)",
}

MAX_EXAMPLES = 5


@dataclass
class Verdict:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ANOMALIES, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {a: [] for a in ANOMALIES})
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.counts.values())

    def add(self, anomaly: str, example: str) -> None:
        self.counts[anomaly] += 1
        if len(self.examples[anomaly]) < MAX_EXAMPLES:
            self.examples[anomaly].append(example)

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "counts": dict(self.counts), "examples": dict(self.examples),
                "stats": dict(self.stats)}

    def table(self) -> str:
        """The verdict as text: one line per anomaly with its count, then a few examples."""
        lines = ["anomaly           count  meaning"]
        for a in ANOMALIES:
            lines.append(f"{a:<17} {self.counts[a]:>5}  {DESCRIPTIONS[a]}")
        for a in ANOMALIES:
            for ex in self.examples[a]:
                lines.append(f"  {a}: {ex}")
        stats = ", ".join(f"{k} {v}" for k, v in self.stats.items())
        lines.append(f"history: {stats}")
        lines.append("verdict: " + ("OK, no anomalies" if self.ok else
                                    f"{sum(self.counts.values())} anomalies"))
        return "\n".join(lines)


def check(history: Iterable[Op]) -> Verdict:
    ops = list(history)
    verdict = Verdict()
    writes: dict[str, Write] = {}
    txns: dict[tuple[str, int], Txn] = {}
    by_txn: dict[tuple[str, int], list[Write]] = defaultdict(list)
    reads: list[Read] = []
    ends: list[ReaderEnd] = []
    for op in ops:
        if isinstance(op, Write):
            writes[op.value] = op
            by_txn[(op.writer, op.txn)].append(op)
        elif isinstance(op, Txn):
            txns[(op.writer, op.txn)] = op
        elif isinstance(op, Read):
            reads.append(op)
        elif isinstance(op, ReaderEnd):
            ends.append(op)

    outcomes = [t.outcome for t in txns.values()]
    verdict.stats = {
        "writes": len(writes), "transactions": len(set(by_txn) | set(txns)),
        "committed": outcomes.count("committed"), "aborted": outcomes.count("aborted"),
        "indeterminate": outcomes.count("unknown"), "reads": len(reads), "readers": len(ends),
    }

    # Which partitions some reader read (a write elsewhere cannot be judged lost).
    covered = {(p.topic, p.partition) for e in ends for p in e.partitions}
    covered |= {(r.topic, r.partition) for r in reads}

    # -- stuck readers ---------------------------------------------------------------------------
    for e in ends:
        for p in e.partitions:
            if p.reached < p.end:
                verdict.add("stuck_read", f"reader {e.reader} stopped at offset {p.reached} of "
                            f"{p.topic}-{p.partition}, below its end {p.end}")

    # -- positions: duplicates and monotonicity ----------------------------------------------
    positions: dict[str, set[tuple[str, int, int]]] = defaultdict(set)
    last: dict[tuple[str, str, int], int] = {}
    for op in ops:
        if isinstance(op, Seek):
            last.pop((op.reader, op.topic, op.partition), None)
        elif isinstance(op, Read):
            positions[op.value].add((op.topic, op.partition, op.offset))
            key = (op.reader, op.topic, op.partition)
            prev = last.get(key)
            if prev is not None and op.offset <= prev:
                verdict.add("non_monotonic", f"reader {op.reader} read {op.topic}-"
                            f"{op.partition} offset {op.offset} after offset {prev}")
            last[key] = op.offset
    for value, found in positions.items():
        if len(found) > 1:
            at = ", ".join(f"{t}-{p}@{o}" for t, p, o in sorted(found))
            verdict.add("duplicate", f"{value!r} read at {at}")

    # -- what was read that must not be visible --------------------------------------------
    for value, found in positions.items():
        w = writes.get(value)
        if w is None:
            verdict.add("aborted_read", f"{value!r} was read but no writer wrote it")
            continue
        t = txns.get((w.writer, w.txn))
        where = ", ".join(f"{tp}-{p}@{o}" for tp, p, o in sorted(found))
        if w.send == "failed":
            verdict.add("aborted_read", f"{value!r} (send reported failed, {w.writer} txn "
                        f"{w.txn}) read at {where}")
        elif t is None:
            verdict.add("aborted_read", f"{value!r} ({w.writer} txn {w.txn}, never ended) "
                        f"read at {where}")
        elif t.outcome == "aborted":
            verdict.add("aborted_read", f"{value!r} ({w.writer} txn {w.txn}, aborted) read "
                        f"at {where}")

    # -- what must be visible, all or nothing ---------------------------------------------------
    read_values = set(positions)
    for txn_key, txn_writes in by_txn.items():
        t = txns.get(txn_key)
        if t is None or t.outcome == "aborted":
            continue
        expected = [w for w in txn_writes
                    if w.send != "failed" and (w.topic, w.partition) in covered]
        if not expected:
            continue
        seen = [w for w in expected if w.value in read_values]
        missing = [w for w in expected if w.value not in read_values]
        if t.outcome == "committed":
            for w in missing:
                verdict.add("lost_write", f"{w.value!r} ({w.writer} txn {w.txn}, committed, "
                            f"send {w.send}) to {w.topic}-{w.partition} never read")
        if seen and missing:
            verdict.add("torn_transaction",
                        f"{txn_key[0]} txn {txn_key[1]} ({t.outcome}): {len(seen)} of {len(expected)} "
                        f"records read, missing e.g. {missing[0].value!r} "
                        f"({missing[0].topic}-{missing[0].partition})")
    return verdict

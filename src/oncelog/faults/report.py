"""The report of a fault run, written into its directory beside the history:

- ``report.md``: the run (command, seed, topology, clients), the verdict table, each anomaly with
  the smallest part of the history that shows it (the operations its check names, as JSON lines),
  the fault windows (what, on which hosts, from when to when, in seconds from the start) and the
  plot;
- ``plot.png``: throughput and latency over time with the faults shaded (faults/plot.py);
- ``verdict.json``: the verdict as JSON.

The report's last line is the run's: ``anomalies: N, faults: F, operations: O`` (N the
anomalies found — the checks' and the clients that never recovered —, F the faults injected, O
the operations in the history: an invoke with its completion counts once).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .plot import plot

MAX_EXCERPTS_PER_ANOMALY = 3
MAX_EXCERPT_OPS = 40


def _seconds(ns: int | None, t0: int) -> str:
    return "-" if ns is None else f"{(ns - t0) / 1e9:.1f}"


def write_report(out_dir: str | os.PathLike[str], *, verdict: Any, ops: Sequence[Any],
                 windows: Sequence[Mapping[str, Any]], run: Mapping[str, Any], excerpt: Any,
                 summary: str, unrecovered: Sequence[str] = (),
                 supervised: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Write report.md, plot.png and verdict.json into ``out_dir``; return report.md's path.
    ``ops`` are the merged history's ops (verify/queue_history.py), ``excerpt(verdict, ops,
    anomaly)`` gives the ops that show one anomaly; ``summary`` is the last line;
    ``supervised``: the Spark driver's restarts by its supervisor (``time``, monotonic ns as
    the history's, and ``reason``)."""
    out = Path(out_dir)
    dicts = [op.to_dict() for op in ops]
    times = [int(d["time"]) for d in dicts if d.get("time") is not None]
    times += [int(w["start"]) for w in windows]
    t0 = min(times, default=0)
    title = (f"{run.get('workload')} workload, faults {run.get('faults')}, seed {run.get('seed')}"
             f": {summary}")
    plot(dicts, windows, out / "plot.png", title=title)
    (out / "verdict.json").write_text(json.dumps(verdict.as_dict(), indent=2, default=str))

    lines = [f"# Fault run: {run.get('workload')} workload, seed {run.get('seed')}", ""]
    lines += ["| | |", "| --- | --- |"]
    for key, value in run.items():
        lines.append(f"| {key} | `{value}` |")
    lines += ["", "## Verdict", "", "```", verdict.table(), "```", ""]
    if unrecovered:
        lines += ["## Clients that did not recover", ""]
        lines += [f"- {u}" for u in unrecovered]
        lines.append("")
    if supervised:
        lines += ["## Spark driver restarted by its supervisor", "",
                  ("The driver exited on its own for a reason a supervisor restarts it for "
                   "(as `spark-submit --supervise` does): Spark could not start a Python worker "
                   "within its fixed 10 s. It went on from its checkpoint."), ""]
        lines += [f"- at {_seconds(int(r['time']), t0)} s: {r['reason']}" for r in supervised]
        lines.append("")
    if not verdict.ok:
        lines += ["## Anomalies", "",
                  ("Each with the smallest part of the history that shows it "
                   "(operations of history.jsonl, by index)."), ""]
        shown: dict[str, int] = {}
        for anomaly in verdict.anomalies:
            if anomaly.allowed:
                continue
            if shown.get(anomaly.name, 0) >= MAX_EXCERPTS_PER_ANOMALY:
                continue
            shown[anomaly.name] = shown.get(anomaly.name, 0) + 1
            lines += [f"### {anomaly.name}: {anomaly.explanation}", "", "```json"]
            part = list(excerpt(verdict, ops, anomaly))
            for op in part[:MAX_EXCERPT_OPS]:
                lines.append(json.dumps(op.to_dict(), default=str))
            if len(part) > MAX_EXCERPT_OPS:
                lines.append(f"... {len(part) - MAX_EXCERPT_OPS} more")
            lines += ["```", ""]
    lines += ["## Fault windows", "", "| fault | from (s) | to (s) | targets | detail |",
              "| --- | --- | --- | --- | --- |"]
    for w in windows:
        targets = ", ".join(str(t) for t in w.get("targets", []))
        detail = str(w.get("detail", "")).replace("|", "/")
        lines.append(f"| {w['fault']} | {_seconds(int(w['start']), t0)} | "
                     f"{_seconds(w.get('end'), t0)} | {targets} | {detail} |")
    lines += ["", "## Throughput and latency", "", "![throughput and latency](plot.png)", "",
              summary, ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path

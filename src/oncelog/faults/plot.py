"""The plot of a fault run: throughput and latency over time, with the fault windows shaded.

``plot(ops, windows, path)`` draws two panels from the merged history (queue format: dicts with
``type``, ``f``, ``process``, ``time`` in monotonic ns) and the nemesis' fault windows (dicts with
``fault``, ``start``, ``end``): operations completed per second (ok, and the failed and
indeterminate ones apart), and each operation's latency from invoke to completion (log scale,
coloured by outcome); every fault window is a shaded band across both, named in the legend, as in
Jepsen's latency and rate graphs. The time axis is seconds from the first operation.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

OUTCOME_COLOURS = {"ok": "#2b8a3e", "fail": "#c92a2a", "info": "#e67700"}
FUNCTION_COLOURS = {"txn ok": "#5f3dc4", "send ok": "#1971c2", "poll ok": "#0ca678",
                    "assign ok": "#868e96", "subscribe ok": "#495057", "fail": "#c92a2a",
                    "info": "#e67700"}
MIN_WINDOW_S = 0.4  # a fault shorter than this (a client crash) is drawn this wide
FAULT_COLOURS = ("#4dabf7", "#f783ac", "#ffd43b", "#b197fc", "#63e6be", "#ffa94d", "#a9e34b",
                 "#ff8787", "#74c0fc", "#e599f7", "#8ce99a", "#ffc078", "#adb5bd")


def _fault_colour(i: int) -> Any:
    """A colour per fault family: the list above, then matplotlib's tab20b (15 families and
    client crashes: no two alike)."""
    if i < len(FAULT_COLOURS):
        return FAULT_COLOURS[i]
    import matplotlib

    return matplotlib.colormaps["tab20b"]((i - len(FAULT_COLOURS)) % 20)


def latencies(ops: Iterable[Mapping[str, Any]]) -> list[tuple[int, float, str, str]]:
    """(invoke time ns, latency ms, outcome, f) of every completed operation: a process runs one
    operation at a time, so its next completion ends its open invoke."""
    open_invokes: dict[str, Mapping[str, Any]] = {}
    out: list[tuple[int, float, str, str]] = []
    for op in ops:
        kind = op.get("type")
        process = str(op.get("process", ""))
        if kind == "invoke":
            open_invokes[process] = op
        elif kind in OUTCOME_COLOURS:
            invoke = open_invokes.pop(process, None)
            if invoke is not None:
                start = int(invoke["time"])
                out.append((start, (int(op["time"]) - start) / 1e6, str(kind),
                            str(op.get("f", ""))))
    return out


def _bins(points: Sequence[tuple[float, str]], width: float) -> dict[str, Counter[int]]:
    by: dict[str, Counter[int]] = {}
    for t, label in points:
        by.setdefault(label, Counter())[int(t // width)] += 1
    return by


def plot(ops: Sequence[Mapping[str, Any]], windows: Sequence[Mapping[str, Any]],
         path: str | os.PathLike[str], title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timed = [op for op in ops if op.get("type") in ("invoke", "ok", "fail", "info")
             and "time" in op]
    t0 = min((int(op["time"]) for op in timed), default=0)
    if windows:
        t0 = min(t0, min(int(w["start"]) for w in windows)) if timed else \
            min(int(w["start"]) for w in windows)

    def sec(ns: int) -> float:
        return (ns - t0) / 1e9

    lat = latencies(timed)
    fig, (rate_ax, lat_ax) = plt.subplots(2, 1, figsize=(12, 7), sharex=True,
                                          gridspec_kw={"height_ratios": [1, 1.3]})
    # -- throughput: completions per second, ok by function, fail and info apart --------------
    width = 1.0
    points = []
    for start, ms, outcome, f in lat:
        label = f"{f} ok" if outcome == "ok" else outcome
        points.append((sec(start) + ms / 1e3, label))
    bins = _bins(points, width)
    end_bin = max((b for c in bins.values() for b in c), default=0)
    xs = [b * width for b in range(end_bin + 1)]
    for label in sorted(bins):
        counts = bins[label]
        ys = [counts.get(b, 0) / width for b in range(end_bin + 1)]
        colour = FUNCTION_COLOURS.get(label)
        rate_ax.step(xs, ys, where="post", label=label, color=colour, linewidth=1.2)
    rate_ax.set_ylabel("operations / s")
    rate_ax.legend(loc="upper right", fontsize=8, ncol=4)
    # -- latency: every operation, by outcome --------------------------------------------------
    for outcome, colour in OUTCOME_COLOURS.items():
        pts = [(sec(s), max(ms, 0.01)) for s, ms, o, _ in lat if o == outcome]
        if pts:
            lat_ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=4, color=colour,
                           label=outcome, alpha=0.6, linewidths=0)
    lat_ax.set_yscale("log")
    lat_ax.set_ylabel("latency (ms)")
    lat_ax.set_xlabel("seconds since the run started")
    # -- fault windows -------------------------------------------------------------------------
    colours: dict[str, str] = {}
    for w in windows:
        name = str(w["fault"])
        colour = colours.setdefault(name, _fault_colour(len(colours)))
        end = w.get("end")
        x0 = sec(int(w["start"]))
        x1 = max(sec(int(end)) if end is not None else x0, x0 + MIN_WINDOW_S)
        for ax in (rate_ax, lat_ax):
            ax.axvspan(x0, x1, color=colour, alpha=0.25, linewidth=0)
    handles, labels = lat_ax.get_legend_handles_labels()
    from matplotlib.patches import Patch

    handles += [Patch(color=c, alpha=0.4) for c in colours.values()]
    labels += list(colours)
    lat_ax.legend(handles, labels, loc="upper right", fontsize=8, ncol=3)
    if title:
        import textwrap

        rate_ax.set_title("\n".join(textwrap.wrap(title, 150)), fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out

"""Tables as Kafka's tools print them (kafka-transactions.sh's ToolsUtils.prettyPrintTable):
each cell padded to its column's width and followed by a tab, so that columns line up on a
terminal and ``cut -f`` / ``split('\\t')`` still find them; and the same rows as JSON for
``--output json``."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TextIO


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                out: TextIO | None = None) -> None:
    out = out or sys.stdout
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    for row in [list(headers)] + cells:
        out.write("".join(f"{v:<{w}}\t" for v, w in zip(row, widths, strict=True)) + "\n")


def print_json(headers: Sequence[str], rows: Sequence[Sequence[object]],
               out: TextIO | None = None) -> None:
    """One object per row, keyed by the column names."""
    out = out or sys.stdout
    json.dump([dict(zip(headers, row, strict=True)) for row in rows], out, indent=2)
    out.write("\n")


def _cell(value: object) -> str:
    return "-" if value is None else str(value)

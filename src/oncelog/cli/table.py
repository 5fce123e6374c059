"""Tables as Kafka's tools print them: kafka-transactions.sh's ToolsUtils.prettyPrintTable
(``print_table``: each cell padded to its column's width and followed by a tab, so that columns
line up on a terminal and ``cut -f`` / ``split('\\t')`` still find them) and
kafka-consumer-groups.sh's fixed-width lines (``table_line``); and the same rows as JSON for
``--output json``, keyed alike by every command (``json_key``)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import TextIO


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]],
                out: TextIO | None = None) -> None:
    out = out or sys.stdout
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    for row in [list(headers)] + cells:
        out.write("".join(f"{v:<{w}}\t" for v, w in zip(row, widths, strict=True)) + "\n")


def print_json(headers: Sequence[str], rows: Sequence[Sequence[object]],
               out: TextIO | None = None) -> None:
    """One object per row, keyed by the column names in snake_case (TransactionalId ->
    transactional_id), as every command's ``--output json`` keys its fields."""
    out = out or sys.stdout
    keys = [json_key(h) for h in headers]
    json.dump([dict(zip(keys, row, strict=True)) for row in rows], out, indent=2)
    out.write("\n")


def dump_json(value: object) -> None:
    """Any value as indented JSON on stdout."""
    print(json.dumps(value, indent=2))


def table_line(cells: list[str], widths: list[int]) -> str:
    """Cells left-justified to their widths, one space apart; the last cell as it is."""
    return " ".join([c.ljust(w) for c, w in zip(cells, widths, strict=False)]
                    + cells[len(widths):]).rstrip()


def json_key(header: str) -> str:
    """A column name as a JSON key: ProducerId, CURRENT-OFFSET, #MEMBERS, COORDINATOR (ID) ->
    producer_id, current_offset, num_members, coordinator."""
    header = re.sub(r" \(id\)", "", header.replace("#", "num_"), flags=re.IGNORECASE)
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", header).lower()
    return re.sub(r"[^a-z0-9]+", "_", snake).strip("_")  # Duration(min) -> duration_min


MISSING = "-"  # Kafka's MISSING_COLUMN_VALUE


def cell(value: object) -> str:
    """A value as a table shows it: ``-`` for none."""
    return MISSING if value is None else str(value)

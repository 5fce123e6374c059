"""HTML building blocks of the console: every value is escaped unless it is ``Html`` already.

A page is assembled from strings; ``html.escape`` is applied to every value that comes from the
broker's state or the request (topic names are restricted, group ids, transactional ids, client
ids and member ids are not), so ``<script>`` in a group id shows as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from html import escape
from urllib.parse import quote


class Html(str):
    """Markup built here, inserted as it is."""


Cell = object  # a value to escape, or Html


def esc(value: object) -> str:
    if isinstance(value, Html):
        return value
    return escape("-" if value is None else str(value), quote=True)


def link(href: str, text: object) -> Html:
    return Html(f'<a href="{esc(href)}">{esc(text)}</a>')


def path_part(name: str) -> str:
    return quote(name, safe="")


def attrs(values: Mapping[str, object]) -> str:
    return "".join(f' {k}="{esc(v)}"' for k, v in values.items())


def table(headers: Iterable[str], rows: Iterable[tuple[Mapping[str, object], Iterable[Cell]]],
          css: str = "", empty: str = "none") -> Html:
    """A table; each row is (attributes of its <tr>, cells)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row_attrs, cells in rows:
        body.append(f"<tr{attrs(row_attrs)}>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                    + "</tr>")
    if not body:
        return Html(f'<p class="empty">{esc(empty)}</p>')
    return Html(f'<table class="{esc(css)}"><thead><tr>{head}</tr></thead><tbody>'
                + "".join(body) + "</tbody></table>")


def age(ms: float | None) -> str:
    """A duration as an operator reads it: 42 s, 3 min 5 s, 15 min, 2 h 10 min, 3 d 4 h."""
    if ms is None or ms < 0:
        return "-"
    s = int(ms // 1000)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        big, small = f"{s // 60} min", f"{s % 60} s"
    elif s < 86400:
        big, small = f"{s // 3600} h", f"{s % 3600 // 60} min"
    else:
        big, small = f"{s // 86400} d", f"{s % 86400 // 3600} h"
    return big if small.startswith("0 ") else f"{big} {small}"


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1f2328; }
header { background: #24292f; color: #fff; padding: 8px 16px; display: flex; gap: 24px;
         align-items: baseline; }
header a { color: #fff; text-decoration: none; }
header a.active { border-bottom: 2px solid #d9822b; }
header .id { margin-left: auto; color: #afb8c1; font-size: 12px; }
main { padding: 8px 16px 24px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 24px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #d0d7de; padding: 3px 10px; text-align: left;
         vertical-align: middle; }
th { background: #f6f8fa; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.stuck td { background: #fff8c5; }
tr.hanging td, tr.offline td, tr.two-phase-long td { background: #ffebe9; }
.badge { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px;
         background: #ddf4ff; }
.badge.warn { background: #fff8c5; } .badge.bad { background: #ffebe9; }
.empty, .note { color: #57606a; }
"""

REFRESH_S = 5


def page(title: str, body: str, *, active: str, identity: str, refresh: bool = True) -> str:
    """The whole document: navigation, the page's body, a meta refresh (no script)."""
    nav = []
    for href, name in (("/topics", "Topics"), ("/transactions", "Transactions"),
                       ("/groups", "Groups"), ("/brokers", "Brokers")):
        cls = ' class="active"' if name == active else ""
        nav.append(f'<a href="{href}"{cls}>{name}</a>')
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">{meta}'
            f"<title>{esc(title)} - oncelog</title><style>{STYLE}</style></head><body>"
            f'<header><strong>oncelog</strong>{"".join(nav)}'
            f'<span class="id">{esc(identity)}</span></header>'
            f"<main><h1>{esc(title)}</h1>{body}</main></body></html>\n")

"""An inline SVG chart of a partition's high watermark and last stable offset over time.

Two step lines on one offset axis: HW (blue) and LSO (orange). While no transaction is open
they coincide; a stuck LSO is the orange line flat under a climbing blue one, the gap between
them shaded. No script, no library: the page carries the SVG as markup.
"""

from __future__ import annotations

from html import escape

HW_COLOUR = "#1f6feb"
LSO_COLOUR = "#d9822b"


def _steps(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for x, y in points:
        if out:
            out.append((x, out[-1][1]))  # hold the value until it changes
        out.append((x, y))
    return out


def _path(points: list[tuple[float, float]]) -> str:
    return " ".join(f"{x:.1f},{y:.1f}" for x, y in points)


def _head(width: int, height: int, title: str) -> str:
    return (f'<svg class="chart" width="{width}" height="{height}" role="img" '
            f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
            f"<title>{escape(title)}</title>"
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fafbfc" '
            'stroke="#d0d7de"/>')


def offsets_chart(history: list[tuple[float, int, int]], last_seen: float, window_s: float,
                  *, width: int = 240, height: int = 48,
                  axes: bool = False, label: str = "") -> str:
    """The SVG markup; ``axes`` adds the offset range and the time span as text."""
    pad_l, pad_r, pad_t, pad_b = (56, 8, 8, 18) if axes else (1, 1, 2, 2)
    if not history:
        return (_head(width, height, f"no readings of {label} yet")
                + f'<text x="{width / 2:.0f}" y="{height / 2 + 4:.0f}" text-anchor="middle" '
                'font-size="11" fill="#57606a">no readings yet</text></svg>')
    # the window up to the latest reading, or as much of it as there are readings for (a
    # broker started a minute ago)
    now = max(last_seen, history[-1][0])  # the chart ends at the latest reading
    start = max(now - window_s, history[0][0])
    window_s = max(now - start, 1.0)
    # the readings, the last one held until the last time it was read
    series = [(max(t, start), hw, lso) for t, hw, lso in history]
    if last_seen > series[-1][0]:
        series.append((last_seen, series[-1][1], series[-1][2]))
    lo = min(min(hw, lso) for _t, hw, lso in series)
    hi = max(max(hw, lso) for _t, hw, lso in series)
    if hi == lo:  # a flat line: drawn across the middle
        lo, hi = lo - 1, hi + 1
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b

    def x(t: float) -> float:
        return pad_l + (t - start) / window_s * plot_w

    def y(v: float) -> float:
        return pad_t + (hi - v) / (hi - lo) * plot_h

    hw_line = _steps([(x(t), y(hw)) for t, hw, _lso in series])
    lso_line = _steps([(x(t), y(lso)) for t, _hw, lso in series])
    gap = hw_line + list(reversed(lso_line))
    title = f"HW and LSO of {label} over the last {int(window_s)} s"
    parts = [_head(width, height, title),
             f'<polygon points="{_path(gap)}" fill="{LSO_COLOUR}" fill-opacity="0.18"/>',
             (f'<polyline points="{_path(hw_line)}" fill="none" stroke="{HW_COLOUR}" '
              f'stroke-width="1.5"/>'),
             (f'<polyline points="{_path(lso_line)}" fill="none" stroke="{LSO_COLOUR}" '
              f'stroke-width="1.5" stroke-dasharray="4 2"/>')]
    if axes:
        parts.append(
            f'<text x="{pad_l - 4}" y="{pad_t + 10}" text-anchor="end" font-size="11">'
            f"{hi}</text>"
            f'<text x="{pad_l - 4}" y="{pad_t + plot_h}" text-anchor="end" font-size="11">'
            f"{lo}</text>"
            f'<text x="{pad_l}" y="{height - 4}" font-size="11">-{int(window_s)} s</text>'
            f'<text x="{width - pad_r}" y="{height - 4}" text-anchor="end" font-size="11">'
            "now</text>"
            f'<text x="{pad_l + plot_w / 2:.0f}" y="{height - 4}" text-anchor="middle" '
            f'font-size="11"><tspan fill="{HW_COLOUR}">&#9472; HW</tspan>  '
            f'<tspan fill="{LSO_COLOUR}">- - LSO</tspan></text>')
    parts.append("</svg>")
    return "".join(parts)

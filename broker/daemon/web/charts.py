"""Line charts as SVG geometry, computed on the server: the template draws what this returns.

Only numbers and labels leave here (point lists, tick positions and their text); every name is escaped by the
template. Both axes are labelled and ticked. A level (a budget's cap) far above every series would flatten the
series into the floor of the chart, so a level more than LEVEL_ROOM times the highest value is not drawn: it is
named below the chart instead (`off_chart`), with how much of it is used.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
WIDTH, HEIGHT, MARGIN = 560, 240, 48
LEFT = 64
"""Room on the left for the y axis's tick labels and its title."""
LEVEL_ROOM = 4.0


@dataclass(frozen=True)
class Line:
    name: str
    points: str
    """`x,y x,y …` in the chart's pixels."""
    color: str
    dashed: bool = False


@dataclass(frozen=True)
class Tick:
    at: float
    """The tick's position in pixels along its axis."""
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    lines: list[Line]
    y_min: float
    y_max: float
    x_min: float
    x_max: float
    width: int = WIDTH
    height: int = HEIGHT
    margin: int = MARGIN
    left: int = LEFT
    x_label: str = ""
    y_label: str = ""
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    off_chart: list[str] = field(default_factory=list)
    """Levels too far above the series to draw, each said in words."""

    @property
    def plot(self) -> tuple[float, float, float, float]:
        """The plotting area in pixels: (left, top, right, bottom)."""
        return float(self.left), self.margin / 2, self.width - self.margin / 2, float(self.height - self.margin)


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]],
               levels: Mapping[str, float] | None = None, *, x_label: str = "", y_label: str = "",
               x_time: bool = False, level_text=None) -> Chart:
    """Each series a polyline; each level (a budget's cap) a dashed horizontal line across the chart, unless it is
    more than LEVEL_ROOM times the highest value (then `level_text(name, value, highest)` says it below the chart).
    `x_time`: x values are unix times (ticks as dates or times of day, UTC)."""
    levels = dict(levels or {})
    values = [y for points in series.values() for _, y in points]
    highest = max(values) if values else 0.0
    drawn = {n: v for n, v in levels.items() if not values or highest <= 0 or v <= LEVEL_ROOM * highest}
    if values and highest <= 0:
        drawn = {}  # nothing spent yet: a cap would be the only thing on the chart
    off = [(level_text or _level_text)(n, v, highest) for n, v in levels.items() if n not in drawn]
    xs = [x for points in series.values() for x, _ in points] or [0.0, 1.0]
    ys = values + list(drawn.values()) or [0.0, 1.0]
    low = min(ys + [0.0]) if min(ys) >= 0 else min(ys)  # money and counts start at 0
    box = _Box(min(xs), max(xs), low, max(ys))
    lines = [Line(name, box.polyline(points), PALETTE[i % len(PALETTE)]) for i, (name, points) in enumerate(series.items())]
    lines += [Line(name, box.polyline([(box.x0, y), (box.x1, y)]), PALETTE[(len(series) + i) % len(PALETTE)], True)
              for i, (name, y) in enumerate(drawn.items())]
    return Chart(title, lines, box.y0, box.y1, box.x0, box.x1, x_label=x_label, y_label=y_label,
                 x_ticks=box.x_ticks(x_time), y_ticks=box.y_ticks(), off_chart=off)


def _level_text(name: str, value: float, highest: float) -> str:
    share = f"{100 * highest / value:.2g}% of it reached" if value > 0 else ""
    return f"{name}: {value:,.2f}, far above the chart ({share})" if share else f"{name}: {value:,.2f}"


def nice_ticks(low: float, high: float, most: int = 5) -> list[float]:
    """Round values between `low` and `high` (1, 2 or 5 × a power of ten apart), at most `most` of them."""
    span = high - low
    if span <= 0 or not math.isfinite(span):
        return [low]
    raw = span / max(1, most - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


class _Box:
    """Data coordinates to pixels (y grows downwards); a flat range is widened so nothing divides by 0."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float):
        self.x0, self.x1 = (x0, x1) if x1 > x0 else (x0 - 0.5, x0 + 0.5)
        self.y0, self.y1 = (y0, y1) if y1 > y0 else (y0 - 0.5, y0 + 0.5)

    def polyline(self, points: Sequence[tuple[float, float]]) -> str:
        return " ".join(f"{self._x(x):.1f},{self._y(y):.1f}" for x, y in points)

    def x_ticks(self, time: bool) -> list[Tick]:
        values = nice_ticks(self.x0, self.x1, 5)
        if not time:
            return [Tick(self._x(v), _number(v)) for v in values]
        days = (self.x1 - self.x0) / 86400
        fmt = "%H:%M" if days < 2 else "%d %b"
        step = 6 * 3600 if days < 2 else 86400 * max(1, math.ceil(days / 5))
        first = math.ceil(self.x0 / step) * step
        stamps = [first + i * step for i in range(int((self.x1 - first) // step) + 1)][:6]
        return [Tick(self._x(t), datetime.fromtimestamp(t, timezone.utc).strftime(fmt)) for t in stamps]

    def y_ticks(self) -> list[Tick]:
        return [Tick(self._y(v), _number(v)) for v in nice_ticks(self.y0, self.y1, 5)]

    def _x(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - LEFT - MARGIN / 2)

    def _y(self, y: float) -> float:
        return HEIGHT - MARGIN - (y - self.y0) / (self.y1 - self.y0) * (HEIGHT - 1.5 * MARGIN)

"""Line charts as SVG geometry, computed on the server: the template draws what this returns.

Only numbers leave here (point lists, tick positions); every name is escaped by the template.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
WIDTH, HEIGHT, MARGIN = 560, 220, 44


@dataclass(frozen=True)
class Line:
    name: str
    points: str
    """`x,y x,y …` in the chart's pixels."""
    color: str
    dashed: bool = False


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


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]],
               levels: Mapping[str, float] | None = None) -> Chart:
    """Each series a polyline; each level (a budget's cap) a dashed horizontal line across the chart."""
    levels = dict(levels or {})
    xs = [x for points in series.values() for x, _ in points] or [0.0, 1.0]
    ys = [y for points in series.values() for _, y in points] + list(levels.values()) or [0.0, 1.0]
    box = _Box(min(xs), max(xs), min(ys), max(ys))
    lines = [Line(name, box.polyline(points), PALETTE[i % len(PALETTE)]) for i, (name, points) in enumerate(series.items())]
    lines += [Line(name, box.polyline([(box.x0, y), (box.x1, y)]), PALETTE[(len(series) + i) % len(PALETTE)], True)
              for i, (name, y) in enumerate(levels.items())]
    return Chart(title, lines, box.y0, box.y1, box.x0, box.x1)


class _Box:
    """Data coordinates to pixels (y grows downwards); a flat range is widened so nothing divides by 0."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float):
        self.x0, self.x1 = (x0, x1) if x1 > x0 else (x0 - 0.5, x0 + 0.5)
        self.y0, self.y1 = (y0, y1) if y1 > y0 else (y0 - 0.5, y0 + 0.5)

    def polyline(self, points: Sequence[tuple[float, float]]) -> str:
        return " ".join(f"{self._x(x):.1f},{self._y(y):.1f}" for x, y in points)

    def _x(self, x: float) -> float:
        return MARGIN + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - 2 * MARGIN)

    def _y(self, y: float) -> float:
        return HEIGHT - MARGIN - (y - self.y0) / (self.y1 - self.y0) * (HEIGHT - 2 * MARGIN)

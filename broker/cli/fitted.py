"""Tables that read at the terminal's width: columns by priority, long values shortened, reasons below the row.

Rich squeezes a table into a narrow terminal by wrapping every column, so a reason stands one word a line and a
48-character hotkey becomes `5GnePgVs8k…sE…`. Here each column has a priority and each table a width: the
columns are laid out whole, in priority order, while they fit (the others are left out, and the caption says
which and that `--wide` shows them); a column that may shrink (a hotkey, an instance name) is shortened in its
middle, never below its `least` width; and a row's long text (a reason, a verdict) is not a column at all but a
`note` printed below the row, indented and folded at word boundaries to the width. With `wide`, every column is
shown whole and nothing is shortened, however wide that makes a line.

Every cell is printed as it is given: pass text from outside through `safe_text.visible` first (or a Rich `Text`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

GAP = 2
ELLIPSIS = "…"


@dataclass(frozen=True)
class Column:
    header: str
    priority: int = 0
    """Lower is more important: the columns left out first at a narrow width have the highest priority."""
    right: bool = False
    least: int | None = None
    """The narrowest this column may be shortened to (in its middle); None: it is never shortened."""
    whole_first: bool = False
    """Shown whole before any less important column is shown (a job id, a model name: read, not just told apart);
    a hotkey is not (its ends tell it apart)."""


@dataclass
class _Row:
    cells: list[Text]
    notes: list[str]
    style: str | None


@dataclass
class Fitted:
    columns: list[Column]
    title: str | None = None
    caption: list[str] = field(default_factory=list)
    rows: list[_Row] = field(default_factory=list)

    def add_row(self, *cells: str | Text, note: str | list[str] | None = None, style: str | None = None) -> None:
        notes = [] if note is None else [note] if isinstance(note, str) else [n for n in note if n]
        self.rows.append(_Row([c if isinstance(c, Text) else Text(str(c)) for c in cells], notes, style))

    def print(self, console: Console, *, wide: bool = False, indent: int = 4) -> None:
        width = console.width
        shown, widths, left_out = self._layout(width, wide)
        if self.title:
            console.print(Text(self.title, style="italic"), overflow="fold")
        console.print(self._line([Text(c.header, style="bold") for c in self.columns], shown, widths), soft_wrap=True)
        for row in self.rows:
            console.print(self._line(row.cells, shown, widths, row.style), soft_wrap=True)
            for note in row.notes:
                for part in note.split("\n"):
                    _folded(console, part, indent, wide, row.style)
        lines = list(self.caption)
        if left_out:
            lines.append(f"({', '.join(left_out)} left out at {width} columns: --wide shows every column)")
        for line in lines:
            console.print(Text(line), overflow="fold")

    def _layout(self, width: int, wide: bool) -> tuple[list[int], list[int], list[str]]:
        """(indices of the columns shown, in order; the width of each column; headers left out).

        Columns are taken in priority order while they fit, a shortenable one counted at its `least` (at its whole
        width when it is `whole_first` and more important than the one being added); then what is left of the width
        goes back to the shortened ones, the most important first, up to their whole width.
        A column empty in every row is left out (its header alone says nothing)."""
        natural = [max([cell_len(c.header)] + [r.cells[i].cell_len for r in self.rows if i < len(r.cells)])
                   for i, c in enumerate(self.columns)]
        if wide:
            return list(range(len(self.columns))), natural, []
        empty = {i for i in range(len(self.columns))
                 if self.rows and all(i >= len(r.cells) or not r.cells[i].plain.strip() for r in self.rows)}
        least = [min(natural[i], c.least) if c.least is not None else natural[i] for i, c in enumerate(self.columns)]
        order = sorted((i for i in range(len(self.columns)) if i not in empty),
                       key=lambda i: (self.columns[i].priority, i))
        chosen: list[int] = []
        for i in order:
            need = [natural[j] if self.columns[j].whole_first and self.columns[j].priority < self.columns[i].priority
                    else least[j] for j in chosen]
            if sum(need) + least[i] + GAP * len(chosen) <= width:
                chosen.append(i)
        chosen.sort()
        widths = list(least)
        room = width - (sum(least[j] for j in chosen) + GAP * (len(chosen) - 1))
        for i in sorted(chosen, key=lambda i: (self.columns[i].priority, i)):
            grow = min(room, natural[i] - widths[i])
            widths[i] += grow
            room -= grow
        left_out = [self.columns[i].header for i in range(len(self.columns)) if i not in chosen and i not in empty]
        return chosen, widths, left_out

    def _line(self, cells: list[Text], shown: list[int], widths: list[int], style: str | None = None) -> Text:
        line = Text(style=style or "")
        for n, i in enumerate(shown):
            cell = cells[i] if i < len(cells) else Text("")
            cell = _shorten(cell, widths[i])
            pad = " " * (widths[i] - cell.cell_len)
            if n:
                line.append(" " * GAP)
            if self.columns[i].right:
                line.append(pad)
                line.append_text(cell)
            else:
                line.append_text(cell)
                if n < len(shown) - 1:
                    line.append(pad)
        return line


def _shorten(cell: Text, width: int) -> Text:
    """`cell` within `width` cells: its middle replaced by an ellipsis (both ends of an id or hotkey stay)."""
    if cell.cell_len <= width:
        return cell
    text = cell.plain
    keep = max(1, width - 1)
    head = (keep + 1) // 2
    tail = keep - head
    return Text(text[:head] + ELLIPSIS + (text[-tail:] if tail else ""), style=cell.style)


def _folded(console: Console, text: str, indent: int, wide: bool, style: str | None) -> None:
    """`text` below a row: indented, folded at word boundaries to the width (a word longer than a line is cut into
    pieces, never lost), no trailing blanks."""
    body = Text(text, style=style or "")
    lines = [body] if wide else body.wrap(console, max(8, console.width - indent), overflow="fold")
    for line in lines:
        line.rstrip()
        console.print(Text(" " * indent) + line, soft_wrap=True)

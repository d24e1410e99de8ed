"""Plain-text output that reads exactly as Rich prints it to a pipe or a file, without importing Rich (~0.1 s).

Used by the lean read path (broker/cli/lean.py) where Rich would print no colours and no styles: stdout is no
terminal (and neither `FORCE_COLOR` nor `TTY_COMPATIBLE=1` says otherwise). Each function returns the lines, or
None when Rich would do something more than lay them out: a line longer than the width (Rich wraps or
folds it), characters whose width is in doubt. The caller then prints with Rich, as before; so this module
never decides what output looks like, it only spares Rich's import where the answer is already known
(tests/broker/cli/test_cli_lean_reads.py checks it line for line against Rich).

The layouts copied: a Rich `Table(box=None)` (every cell padded one space each side, the title and caption
centred over it), a `Padding(Text, (0, 0, 0, n))` (indented, then padded with spaces to the width), and
`broker/cli/fitted.py`'s columns by priority.
"""

from __future__ import annotations

import os
import sys
import unicodedata

ELLIPSIS = "…"
GAP = 2


def usable(stream=None) -> bool:
    """Whether Rich would print to `stream` (stdout) with no styles at all: it is not a terminal."""
    env = os.environ
    if env.get("TTY_COMPATIBLE") == "1":
        return False
    if env.get("TTY_COMPATIBLE") != "0":
        force = env.get("FORCE_COLOR")
        if force is not None:
            return force == ""
        try:
            if (stream or sys.stdout).isatty():
                return False
        except (AttributeError, ValueError, OSError):
            pass
    return True


def width() -> int | None:
    """The width Rich would lay out to (its `Console.size`): `COLUMNS`, else the first standard stream that is a
    terminal, else 80; None where that is in doubt."""
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        return int(columns) if int(columns) > 0 else None
    for fd in (0, 1, 2):
        try:
            return os.get_terminal_size(fd).columns or 80
        except (AttributeError, ValueError, OSError):
            continue
    return 80


def cell_len(text: str) -> int | None:
    """Cells `text` takes; None when a character's width is in doubt (then Rich lays it out)."""
    if text.isascii():
        return len(text) if text.isprintable() or not text else None
    n = 0
    for ch in text:
        if unicodedata.combining(ch) or unicodedata.category(ch) in ("Cc", "Cf", "Mn", "Me"):
            return None
        n += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return n


def line(text: str, at: int) -> str | None:
    """`console.print(text)` without soft wrap: the text when it fits the width (else Rich wraps it)."""
    n = cell_len(text)
    return text if n is not None and n <= at else None


def padded(text: str, indent: int, at: int) -> str | None:
    """`console.print(Padding(Text(text), (0, 0, 0, indent)))`: indented and padded with spaces to the width."""
    n = cell_len(text)
    if n is None or n + indent > at:
        return None
    return " " * indent + text + " " * (at - indent - n)


def table(headers: list[str], rows: list[list[str]], at: int, *, title: str | None = None,
          caption: str | None = None, right: frozenset[int] = frozenset()) -> list[str] | None:
    """A Rich `Table(*headers, box=None, title=…, caption=…)` as it prints when its natural width fits `at`."""
    cells = [headers, *rows]
    lens = [[cell_len(c) for c in row] for row in cells]
    if any(n is None for row in lens for n in row):
        return None
    widths = [max(row[i] for row in lens) for i in range(len(headers))]
    total = sum(w + 2 for w in widths)
    if total > at:
        return None
    out = []
    for extra in (title,):
        if extra is not None:
            centred = _centred(extra, total)
            if centred is None:
                return None
            out.append(centred)
    for row, row_lens in zip(cells, lens):
        parts = []
        for i, (cell, n) in enumerate(zip(row, row_lens)):
            pad = " " * (widths[i] - n)
            parts.append(" " + (pad + cell if i in right else cell + pad) + " ")
        out.append("".join(parts))
    if caption is not None:
        centred = _centred(caption, total)
        if centred is None:
            return None
        out.append(centred)
    return out


def _centred(text: str, total: int) -> str | None:
    n = cell_len(text)
    if n is None or n > total:
        return None
    left = (total - n) // 2
    return " " * left + text + " " * (total - n - left)


def fitted(columns: list[tuple[str, int, int | None, bool, bool]], rows: list[list[str]], at: int, *,
           wide: bool = False) -> list[str] | None:
    """broker/cli/fitted.py's `Fitted.print` (no title, notes or caption beyond the left-out line), its columns
    given as (header, priority, least, whole_first, right)."""
    lens = [[cell_len(c) for c in row] for row in rows]
    heads = [cell_len(c[0]) for c in columns]
    if (any(n is None or n != len(c) for row, row_lens in zip(rows, lens) for c, n in zip(row, row_lens))
            or any(n is None or n != len(c[0]) for c, n in zip(columns, heads))):
        return None  # only cells of one character a cell are shortened here
    natural = [max([heads[i]] + [r[i] for r in lens]) for i in range(len(columns))]
    if wide:
        return _fitted_lines(columns, rows, list(range(len(columns))), natural, [], at)
    empty = {i for i in range(len(columns)) if rows and all(not r[i].strip() for r in rows)}
    least = [min(natural[i], c[2]) if c[2] is not None else natural[i] for i, c in enumerate(columns)]
    order = sorted((i for i in range(len(columns)) if i not in empty), key=lambda i: (columns[i][1], i))
    chosen: list[int] = []
    for i in order:
        need = [natural[j] if columns[j][3] and columns[j][1] < columns[i][1] else least[j] for j in chosen]
        if sum(need) + least[i] + GAP * len(chosen) <= at:
            chosen.append(i)
    chosen.sort()
    widths = list(least)
    room = at - (sum(least[j] for j in chosen) + GAP * (len(chosen) - 1))
    for i in sorted(chosen, key=lambda i: (columns[i][1], i)):
        grow = min(room, natural[i] - widths[i])
        widths[i] += grow
        room -= grow
    left_out = [columns[i][0] for i in range(len(columns)) if i not in chosen and i not in empty]
    return _fitted_lines(columns, rows, chosen, widths, left_out, at)


def _fitted_lines(columns, rows, chosen: list[int], widths: list[int], left_out: list[str], at: int):
    out = []
    for row in [[c[0] for c in columns], *rows]:
        text = ""
        for n, i in enumerate(chosen):
            cell = _shorten(row[i], widths[i])
            pad = " " * (widths[i] - cell_len(cell))
            if n:
                text += " " * GAP
            text += pad + cell if columns[i][4] else cell + (pad if n < len(chosen) - 1 else "")
        out.append(text)
    if left_out:
        note = line(f"({', '.join(left_out)} left out at {at} columns: --wide shows every column)", at)
        if note is None:
            return None
        out.append(note)
    return out


def _shorten(text: str, at: int) -> str:
    if cell_len(text) <= at:
        return text
    keep = max(1, at - 1)
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + ELLIPSIS + (text[-tail:] if tail else "")

"""Text from outside trainmaster (file names, reasons, job names, URLs) made safe to print on a terminal.

A file name or a reason can carry terminal control sequences: `ESC [ 2 J` clears the screen, an OSC
sets the window title or writes a hyperlink, and together they can paint a fake verdict over the real
one. `visible` renders every C0 control (newline and tab included), DEL and every C1 control (so the
one-byte CSI and OSC introducers too) as a visible escape, plus the Unicode controls that reorder or
break lines (bidi overrides and isolates, line and paragraph separators). The same is done on a
terminal and in a pipe, so what a script reads is what a person would have seen. `markup` also
escapes Rich markup, for text printed through Rich.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: object) -> str:
    """`text` (made a `str`) with every control character written as `\\xNN` or `\\uNNNN`."""
    return _UNSAFE.sub(_escaped, str(text))


def markup(text: object) -> str:
    """`visible(text)`, with Rich markup escaped: for a string printed through a Rich console."""
    from rich.markup import escape

    return escape(visible(text))

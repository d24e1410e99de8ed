"""Text an executor we do not control sent (its log, metric names, reasons), made harmless before anyone prints it.

A miner's log can carry terminal control sequences: `ESC ] 0 ; … BEL` sets the window's title, `ESC [ 2 J`
clears the screen, a bare carriage return paints over a line, so a log could draw a fake verdict over the
real one. Every C0 control (but the line feed and the tab that keep a log readable), DEL, every C1 control and
the Unicode controls that reorder or break lines are written as visible escapes (`\\x1b`), the same on a
terminal and in a pipe, as `broker/cli/safe_text.py` does for what the CLI prints of reasons and names.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def log_text(text: str) -> str:
    """`text` with its line ends kept (a CRLF read as one) and every other control character made visible."""
    return _UNSAFE.sub(_escaped, text.replace("\r\n", "\n"))


def attempt_log(offer_json: str, text: str) -> str:
    """A chunk of an attempt's log as it may be shown: as it is from compute we trust, else `log_text`."""
    from trainmaster.backends.base import Offer

    return text if Offer.model_validate_json(offer_json).trusted else log_text(text)

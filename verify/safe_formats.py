"""The plain formats a returned file is positively identified as, from its first bytes: images by
their magic bytes, and UTF-8 text (JSON, CSV or other) — which verify/pickle_stream.py has already
found not to be a pickle stream, since protocol 0 pickles are ASCII.

These are the "data" of verify/output_kinds.py; whatever is not identified here or there is refused
from untrusted compute as unrecognised.
"""

from __future__ import annotations

import codecs
import json
import re

CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f]")
"""Control bytes no text holds (tab, newlines, form feed and the escape of terminal colours it may)."""
IMAGES = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"BM", "a BMP image"),
)


def image_kind(head: bytes) -> str | None:
    """Which image format ``head`` starts with, if any."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    for magic, what in IMAGES:
        if head.startswith(magic) and (magic != b"BM" or _bmp_header(head)):
            return what
    return None


def _bmp_header(head: bytes) -> bool:
    """Whether ``BM…`` goes on as a BMP header: a known DIB header size at byte 14."""
    return len(head) >= 18 and int.from_bytes(head[14:18], "little") in (12, 40, 52, 56, 64, 108, 124)


def text_kind(head: bytes, *, complete: bool) -> str | None:
    """What UTF-8 text ``head`` is ("JSON text", "CSV text", "UTF-8 text"), or None when it is not
    text: bytes that do not decode, or a control byte (:data:`CONTROL`). ``complete``: ``head`` is
    the whole file (otherwise a character cut at its end is allowed)."""
    if CONTROL.search(head):
        return None
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=complete)
    except UnicodeDecodeError:
        return None
    stripped = text.lstrip("\ufeff \t\r\n")
    if complete and stripped[:1] in ("{", "[") and _json(stripped):
        return "JSON text"
    if stripped[:1] == "{" and "\n{" in stripped:
        return "JSON lines"
    if _csv(stripped):
        return "CSV text"
    return "UTF-8 text"


def _json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _csv(text: str) -> bool:
    """Whether the first lines have the same number of commas, at least one."""
    lines = [line for line in text.splitlines()[:5] if line]
    return len(lines) >= 2 and lines[0].count(",") > 0 and len({line.count(",") for line in lines}) == 1

"""The canonical serialization's header (``jobs/canonical.py``) from each tensor's name, dtype code and shape
alone, without torch: what checks a file's header against the canonical one (``verify/safeload.py``, in the
verification of every run) builds it here, so that a check which replays nothing never imports torch."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Sequence

FORMAT = "trainmaster-canonical-v1"
ITEM_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
"""Bytes per element of each dtype code the canonical form (and safeload) admits."""


def header_for(entries: Iterable[tuple[str, str, Sequence[int]]]) -> bytes:
    """The length prefix and padded JSON header for ``(name, dtype code, shape)`` entries in canonical order."""
    header: dict[str, object] = {"__metadata__": {"format": FORMAT}}
    offset = 0
    for name, code, shape in entries:
        size = math.prod(shape) * ITEM_SIZES[code]
        header[name] = {"data_offsets": [offset, offset + size], "dtype": code, "shape": list(shape)}
        offset += size
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text

"""The bounds on looking into a returned zip archive (verify/output_kinds.py), so that a hostile one
costs milliseconds, not hours.

A 76 KB zip whose 200 directory entries all point at one compressed 64 MiB member took 49 s to
classify (every entry decompressed again); 65,535 entries would take hours. So:

- entries whose bytes overlap (two central-directory entries whose local header and data share a
  byte: the overlapping-entry zip bomb) mark the archive as hostile, refused whatever the trust;
  no writer produces them;
- an archive whose entries declare more than :data:`MAX_UNCOMPRESSED_BYTES` in all is not looked
  into (the member count and directory size are bounded in output_kinds before it is listed);
- looking into archives has one budget per verification, all archives together
  (:data:`MAX_INSPECTED_BYTES`): each decompressed byte spends one, and each member an archive's
  directory can hold spends :data:`MEMBER_COST` before the directory is parsed (65,535 entries took
  0.26 s to list). Members past the budget are left uninspected, archives past it unlisted: either
  way the archive is unchecked (kept opaque from trusted compute, refused from untrusted).
"""

from __future__ import annotations

import struct
import zipfile
from typing import BinaryIO

MAX_UNCOMPRESSED_BYTES = 1 << 40
"""1 TiB declared in all: well past any model archive, far short of what a bomb declares."""
MAX_INSPECTED_BYTES = 256 * 2**20
"""What looking into all the archives of one verification may spend: about a second of work. Real
archives spend little: 16 bytes of each member, a numpy header (at most ~10 KB), JSON members
searched for Stable-Baselines3's cloudpickle fields (a few KB each), 1 KiB per member listed."""
MEMBER_COST = 1024
MIN_ENTRY_BYTES = 46
"""A central-directory entry's fixed part: a directory of N bytes holds at most N / 46 entries."""
LOCAL_HEADER = struct.Struct("<4s22xHH")
"""A local file header's fixed 30 bytes: its signature, then (past 22 bytes) the name and extra lengths."""


def overlapping(archive: zipfile.ZipFile, handle: BinaryIO) -> int:
    """How many entries share bytes with the entry before them (in offset order): 0 in any archive a
    zip writer made. Each entry's span is its local header, name, extra field and compressed data."""
    spans = []
    for info in archive.infolist():
        handle.seek(info.header_offset)
        local = handle.read(LOCAL_HEADER.size)
        if len(local) < LOCAL_HEADER.size:
            return 0  # a header past the end: the archive is damaged, which reading it reports
        _, name_length, extra_length = LOCAL_HEADER.unpack(local)
        start = info.header_offset
        spans.append((start, start + LOCAL_HEADER.size + name_length + extra_length + info.compress_size))
    spans.sort()
    return sum(1 for (_, end), (start, _) in zip(spans, spans[1:]) if start < end)


def declared_too_big(archive: zipfile.ZipFile) -> str | None:
    """Why the members are not looked into, from the sizes they declare; None when within bounds."""
    declared = sum(info.file_size for info in archive.infolist())
    if declared > MAX_UNCOMPRESSED_BYTES:
        return f"its members declare {declared} bytes uncompressed, over the limit of {MAX_UNCOMPRESSED_BYTES}"
    return None


class Budget:
    """What looking into archives may still spend (one per verification: the safety check's)."""

    def __init__(self):
        self.left = MAX_INSPECTED_BYTES

    def list(self, entries: int, directory_bytes: int) -> bool:
        """Whether a directory announcing ``entries`` in ``directory_bytes`` may be listed (then spent)."""
        cost = max(entries, directory_bytes // MIN_ENTRY_BYTES) * MEMBER_COST
        if cost > self.left:
            return False
        self.left -= cost
        return True

    def take(self, wanted: int) -> int:
        """How many of ``wanted`` bytes may be read now (0 once spent); they count as spent."""
        granted = max(0, min(wanted, self.left))
        self.left -= granted
        return granted

"""The returned files that verification parses whole, and the size each may have.

A file the verifier parses (the commitment, its signature, result.json, a segment manifest) is read
with a size limit checked before its first byte (jobs/files.py). The safety check also refuses one
over its limit wherever it lies, parsed in this run or not: a 3 GB result.json is refused by
`trainmaster verify DIR` even without the job spec that would have it read, and is named as what it
is, not as a failure to read it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from trainmaster.jobs import commitment
from trainmaster.jobs import segment_layout as checkpoint
from trainmaster.jobs.output_tree import Entry

from .outcome import MAX_RESULT_BYTES, RESULT_FILE

SIGNATURE_FILE = "commitment.sig"
"""As verify/pipeline.py names it (which imports this module, so it cannot be imported from there)."""
MAX_SIGNATURE_BYTES = 1024
"""An sr25519 signature is 64 bytes, 130 characters in hex with its 0x."""

LIMITS = (
    (commitment.FILENAME, commitment.MAX_BYTES),
    (SIGNATURE_FILE, MAX_SIGNATURE_BYTES),
    (RESULT_FILE, MAX_RESULT_BYTES),
    (f"checkpoints/segments/*/{checkpoint.MANIFEST}", checkpoint.MAX_MANIFEST_BYTES),
)
"""``(relative path pattern, most bytes)``; ``*`` spans folders."""


def oversized(files: Iterable[Entry]) -> list[str]:
    """Why each parsed file over its limit is refused (its size from the listing's lstat, never opened)."""
    found = []
    for item in files:
        for pattern, limit in LIMITS:
            if fnmatch.fnmatchcase(item.relative, pattern):
                size = item.entry.stat(follow_symlinks=False).st_size
                if size > limit:
                    found.append(f"{item.relative} is {size} bytes, over the limit of {limit} bytes for this file")
                break
    return found

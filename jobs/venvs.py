"""Where a job's `environment: {python: requirements}` virtualenv lives: a cache keyed by the requirements' hash.

The local backend's supervisor builds it there (`backends/local/supervisor.py`); the verifier finds it
there again from the requirements in a fresh, hash-checked extraction of the bundle, so a job's
evaluator runs with the environment the broker built — never with an interpreter named by a file the
job itself could have written.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

LAYOUT = b"2"  # part of a cached virtualenv's key: bump when what the supervisor builds changes
READY = ".ready"  # written last, once the virtualenv is complete


def venv_key(requirements: bytes) -> str:
    """The cache key of the virtualenv built for these requirements (the file's bytes)."""
    return hashlib.sha256(LAYOUT + b"\0" + requirements).hexdigest()[:16]


def built_python(envs_dir: Path, requirements: Path) -> str | None:
    """The interpreter of the virtualenv built for the requirements file, or None when none is built
    (or the file cannot be read)."""
    try:
        venv = Path(envs_dir) / venv_key(Path(requirements).read_bytes())
    except OSError:
        return None
    return str(venv / "bin" / "python") if (venv / READY).is_file() else None

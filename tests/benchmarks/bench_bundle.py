"""Bundle hashing vs raw sha256 over the same bytes.

The figure: `bundle_digest` over a ~1 GB tree (1000 x 1 MiB random files plus small ones) against
reading the same files and hashing them with nothing else, both with the page cache warm, best of 3
each. Target: ratio >= 0.8. `run(smoke=True)` does the same over ~20 MB.

Run: python tests/benchmarks/bench_bundle.py
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from trainmaster.jobs.bundle import bundle_digest

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

MB = 1_000_000  # throughputs are in MB/s (10^6 bytes)
_READ_CHUNK = 1024 * 1024


def run(smoke: bool = False) -> dict[str, float]:
    big_files, small_files = (20, 50) if smoke else (1000, 500)
    with tempfile.TemporaryDirectory(prefix="bench-bundle-") as tmp:
        root = Path(tmp)
        files = _make_tree(root, big_files, small_files)
        total = sum(f.stat().st_size for f in files)
        _raw_sha256(files)  # warm the page cache
        raw = _best_of(3, lambda: _raw_sha256(files))
        digest = _best_of(3, lambda: bundle_digest(root, b"{}"))
    return {
        "files": float(len(files)),
        "MB hashed": total / MB,
        "raw sha256, read + hash (MB/s)": total / raw / MB,
        "bundle_digest (MB/s)": total / digest / MB,
        "ratio": raw / digest,
    }


def _make_tree(root: Path, big_files: int, small_files: int) -> list[Path]:
    """`big_files` 1 MiB random files in 10 directories, plus small files of 10 B - 8 KiB."""
    rng = random.Random(0)
    files = []
    for i in range(big_files):
        files.append(_write(root / f"shard{i % 10}" / f"blob{i:04d}.bin", os.urandom(1024 * 1024)))
    for i in range(small_files):
        files.append(_write(root / "src" / f"pkg{i % 7}" / f"mod{i:03d}.py", os.urandom(rng.randint(10, 8192))))
    return files


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _raw_sha256(files: list[Path]) -> str:
    """The baseline: read every file into one reused buffer and hash it, nothing else."""
    digest = hashlib.sha256()
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                digest.update(view[:n])
    return digest.hexdigest()


def _best_of(repeats: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


if __name__ == "__main__":
    print_figures(
        "bundle hashing vs raw sha256 of the same files (best of 3, page cache warm)", run(), {"ratio": ">= 0.8"}
    )

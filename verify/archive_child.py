"""Looking into returned zip and tar archives in a child process under CPU and memory limits.

An archive is the one output whose inspection does work out of proportion to its size (a 76 KB archive
made 200 decompressions of 64 MiB). verify/zip_bounds.py bounds that work by design; this child is
the defence in depth, as for safetensors (verify/safeload.py's ``check_files_isolated``): the
archives of one verification are classified together, with one inspection budget, in a process that
after its imports may use :data:`MEMORY_BYTES` more memory and :data:`CPU_SECONDS` of CPU. An archive
that runs it out of memory, or a child stopped by the CPU limit, is HOSTILE: refused whatever the trust.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from trainmaster.jobs.files import HostileFile

from .errors import VerificationError
from .output_kinds import HOSTILE, FileKind, classify
from .safeload import limit_self
from .zip_bounds import Budget

MEMORY_BYTES = 512 * 2**20
CPU_SECONDS = 20
"""The budget (zip_bounds.MAX_INSPECTED_BYTES) takes about a second of CPU; twenty is a wide margin."""


def classify_archives(paths: Sequence[Path], *, memory_bytes: int = MEMORY_BYTES,
                      cpu_seconds: int = CPU_SECONDS) -> dict[str, FileKind]:
    """``{str(path): kind}`` of each zip or tar archive, classified in a limited child process."""
    request = {"paths": [str(p) for p in paths], "memory_bytes": memory_bytes, "cpu_seconds": cpu_seconds}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(request), capture_output=True,
                          text=True, env=env, check=False)
    if done.returncode < 0:
        stopped = FileKind(HOSTILE, "an archive whose inspection was stopped by the CPU limit (a hostile file)")
        return {str(p): stopped for p in paths}
    if done.returncode != 0:
        raise VerificationError(f"the isolated archive check failed: {done.stderr.strip()[-500:]}", kind="cannot_verify")
    return {path: FileKind(**kind) for path, kind in json.loads(done.stdout).items()}


def _classify_all(paths: Sequence[str]) -> dict[str, FileKind]:
    """What the child runs: each archive classified, one budget for all of them."""
    budget, kinds = Budget(), {}
    for path in paths:
        try:
            kinds[path] = classify(Path(path), budget)
        except MemoryError:
            kinds[path] = FileKind(HOSTILE, "an archive whose inspection ran out of the memory limit (a hostile file)")
        except HostileFile as exc:  # swapped for a link or a FIFO since the walk
            kinds[path] = FileKind(HOSTILE, f"an archive that {exc.reason}")
    return kinds


def _serve() -> None:
    request = json.load(sys.stdin)
    limit_self(request["memory_bytes"], request["cpu_seconds"])
    kinds = _classify_all(request["paths"])
    json.dump({path: dataclasses.asdict(kind) for path, kind in kinds.items()}, sys.stdout)


if __name__ == "__main__":
    _serve()

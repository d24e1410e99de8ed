"""Before a challenged segment is opened: re-make the states the run hashed but did not keep.

A run with ``checkpoint.keep_every: m`` keeps only some states (docs/runtime.md); its checkpoint folder
records how to import its recipe (``reopen.json``). When a challenge names a segment whose state, or the
state after it, is not on disk, the executor's backend runs ``python -m trainmaster.jobs.reopen`` with
the job's own interpreter, which re-runs from the nearest kept state and writes the segment back only
if it reproduces the committed leaf. Its time is the executor's, inside its time to answer.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from trainmaster.jobs.files import HostileFile, read_regular

LOCATION_FILE = "reopen.json"
TIMEOUT_S = 3600.0


class ReopenFailed(RuntimeError):
    """The executor could not re-make a state it dropped (it did not reproduce, or could not run)."""


def dropped(checkpoints: Path, indices: list[int]) -> list[int]:
    """The states the openings of ``indices`` need (i and i + 1) that have a manifest and no files."""
    base = Path(checkpoints) / "segments"
    out = []
    for j in sorted({x for i in indices for x in (i, i + 1)}):
        folder = base / f"{j:08d}"
        if (folder / "manifest.json").is_file() and not (folder / "weights.safetensors").exists():
            out.append(j)
    return out


async def reopen_dropped(checkpoints: Path, indices: list[int]) -> list[int]:
    """Re-make the dropped states the openings of ``indices`` need; the ones re-made. Raises :class:`ReopenFailed`."""
    wanted = await asyncio.to_thread(dropped, checkpoints, indices)
    if not wanted:
        return []
    try:
        location = json.loads(read_regular(Path(checkpoints) / LOCATION_FILE, 2**20))
    except (OSError, ValueError, HostileFile) as exc:
        raise ReopenFailed(f"states {wanted} were not kept and the run left no {LOCATION_FILE} to re-make them: {exc}") from None
    python = location.get("python") if isinstance(location, dict) else None
    if not isinstance(python, str) or not os.path.isabs(python):
        raise ReopenFailed(f"{LOCATION_FILE} names no interpreter to re-make states {wanted} with")
    process = await asyncio.create_subprocess_exec(
        python, "-m", "trainmaster.jobs.reopen", str(checkpoints), "--segments", ",".join(map(str, sorted(set(indices)))),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise ReopenFailed(f"re-making states {wanted} took more than {TIMEOUT_S:.0f} s") from None
    if process.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise ReopenFailed(lines[-1][-500:] if lines else f"reopen exited with code {process.returncode}")
    return wanted


async def open_boundaries(checkpoints: Path, indices: list[int], dest: Path) -> None:
    """The sampled tier's answer: chunks of every boundary, drawn from the root and the challenged ``indices``,
    written to ``dest/chunks/`` (jobs/boundary_chunks.py); every dropped state is re-made first."""
    base = Path(checkpoints) / "segments"
    count = await asyncio.to_thread(lambda: sum(1 for p in base.iterdir() if p.name.isdigit()) if base.is_dir() else 0)
    if count < 2:
        return
    await reopen_dropped(checkpoints, list(range(count - 1)))
    from trainmaster.jobs.boundary_chunks import write_openings

    await asyncio.to_thread(write_openings, Path(checkpoints), sorted(set(indices)), Path(dest))

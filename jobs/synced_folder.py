"""What the container launcher keeps in the synced folder (jobs/launch_plan.py, `SYNC_*`) besides the job's own files.

Node 0 reads it once before the job starts (does `checkpoints/` hold a complete segment to resume from?) and
writes it once the job ended: the outputs' manifest, then the exit record, each atomically, so the broker's
side, reading the folder's copy in the object store, sees a record whole or not at all, and sees the exit
record only once the manifest is there. It then copies the outputs into the service's model folder, if any.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainmaster.jobs import output_tree
from trainmaster.jobs.files import HostileFile, read_regular, sha256_file, write_json_atomic
from trainmaster.jobs.launch_plan import SYNC_EXIT, SYNC_MANIFEST

MAX_MANIFEST_BYTES = 2**16


def holds_segment(checkpoints: Path) -> bool:
    """Whether `checkpoints/segments/` holds a complete segment: an 8-digit folder whose manifest.json parses."""
    base = checkpoints / "segments"
    if not base.is_dir():
        return False
    for folder in base.iterdir():
        if len(folder.name) == 8 and folder.name.isascii() and folder.name.isdigit():
            try:
                json.loads(read_regular(folder / "manifest.json", MAX_MANIFEST_BYTES))
                return True
            except (OSError, ValueError, HostileFile):
                continue
    return False


def outputs_manifest(outputs: Path) -> dict:
    """{"files": {relative path: {"size", "sha256"}}} of every regular file under `outputs` (links and special
    files are left out: output_tree refuses them)."""
    files = {}
    for item in output_tree.walk(outputs).files:
        files[item.relative] = {"size": item.entry.stat(follow_symlinks=False).st_size,
                                "sha256": sha256_file(item.entry.path)}
    return {"files": files}


def record_end(sync: Path, outputs: Path, *, exit_code: int, reason: str, started_at: float, ended_at: float) -> dict:
    """Write the outputs' manifest, then the exit record; returns the manifest."""
    manifest = outputs_manifest(outputs)
    write_json_atomic(sync / SYNC_MANIFEST, manifest)
    write_json_atomic(sync / SYNC_EXIT, {"exit_code": exit_code, "reason": reason, "started_at": started_at,
                                         "ended_at": ended_at})
    return manifest


def copy_outputs(outputs: Path, manifest: dict, model_dir: Path) -> None:
    """Copy the files `manifest` lists from `outputs` into the service's model folder (which it uploads)."""
    for relative in manifest["files"]:
        target = model_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(outputs / relative, target, follow_symlinks=False)

"""checkpoint.keep_every / max_disk_gb: every state hashed into the commitment, only a few kept, a dropped
one re-made from the nearest kept state (bit for bit, checked against its committed leaf) before it is opened."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainmaster.backends.local.backend import copy_segments
from trainmaster.backends.segment_reopen import ReopenFailed, dropped, reopen_dropped
from trainmaster.jobs import environment
from trainmaster.jobs.checkpoint import kept_indices, read_manifest, read_segment, segment_dir, segment_indices
from trainmaster.jobs.commitment import read_commitment
from trainmaster.jobs.spec import Checkpointing
from trainmaster.verify.openings import LocalOpenings, open_checked, open_next_state_checked

LM = ["--d-model", "16", "--heads", "2", "--seq-len", "8", "--batch-size", "2"]


def _train(root: Path, steps: int, **extra) -> subprocess.CompletedProcess:
    env = environment.job_environment(job_id="keep", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=3,
                                      segment_steps=2, bundle_sha256="0" * 64, **extra)
    command = [sys.executable, "-m", "trainmaster.jobs.recipes.tiny_lm", "--steps", str(steps), *LM]
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("keep")
    every, some = _train(root / "all", 20), _train(root / "some", 20, keep_every=4)
    assert every.returncode == 0 and some.returncode == 0, (every.stderr[-2000:], some.stderr[-2000:])
    return root / "all", root / "some"


def test_every_state_is_committed_and_only_every_m_th_kept(runs):
    every, some = runs
    assert read_commitment(some / "out" / "commitment.json") == read_commitment(every / "out" / "commitment.json")
    assert segment_indices(some / "ckpt") == list(range(11))  # n = 10: every leaf recorded
    assert kept_indices(some / "ckpt") == [0, 4, 8, 9, 10]  # S_0, every 4th, S_{n-1}, S_n
    dropped_dir = segment_dir(some / "ckpt", 5)
    assert read_manifest(dropped_dir).kept is False and sorted(p.name for p in dropped_dir.iterdir()) == ["manifest.json"]
    assert read_manifest(dropped_dir).leaf == read_manifest(segment_dir(every / "ckpt", 5)).leaf
    disk = lambda r: sum(f.stat().st_size for f in (r / "ckpt" / "segments").rglob("*.safetensors"))  # noqa: E731
    assert disk(some) < 0.6 * disk(every)


def test_a_dropped_state_is_re_made_bit_for_bit_and_opens_against_the_root(runs, tmp_path):
    _, some = runs
    work = tmp_path / "ckpt"
    shutil.copytree(some / "ckpt", work)
    commitment = read_commitment(some / "out" / "commitment.json")
    assert dropped(work, [5]) == [5, 6]
    dest = asyncio.run(copy_segments(work, [5], tmp_path / "opened"))  # the local backend's open_segments
    assert {5, 6} <= set(kept_indices(work))
    opening = open_checked(LocalOpenings(dest), commitment, 5)
    rest = open_next_state_checked(LocalOpenings(dest), opening)
    assert int(rest["runtime/step"]) == 12
    read_segment(segment_dir(work, 6))  # its files match its (re-written) manifest


def test_a_state_that_does_not_reproduce_is_never_opened(runs, tmp_path):
    _, some = runs
    work = tmp_path / "ckpt"
    shutil.copytree(some / "ckpt", work)
    manifest = json.loads((segment_dir(work, 6) / "manifest.json").read_text())
    manifest["leaf"] = "0" * 64  # as if the run had committed to something its kept states do not lead to
    (segment_dir(work, 6) / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ReopenFailed, match="does not reproduce the committed leaf of segment 6"):
        asyncio.run(reopen_dropped(work, [5]))
    assert not (segment_dir(work, 6) / "weights.safetensors").exists()


def test_the_disk_budget_stops_the_run_with_the_reason(tmp_path):
    done = _train(tmp_path, 20, max_disk_gb=1e-5)
    assert done.returncode != 0
    assert "over checkpoint.max_disk_gb" in done.stderr and "raise checkpoint.keep_every" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_spec_fields_are_validated():
    assert Checkpointing(keep_every=40, max_disk_gb=2.5).keep_every == 40
    for bad in ({"keep_every": 0}, {"max_disk_gb": 0}, {"keep_everything": True}):
        with pytest.raises(ValueError):
            Checkpointing(**bad)

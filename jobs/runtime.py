"""The in-job runtime: what a training script calls to train with verifiable checkpoints.

A script describes its training as a :class:`~trainmaster.jobs.recipe.Recipe` (a config model and
a ``build(config, seed) -> Trainer``) and calls :func:`run`. The runtime then

* reads its settings from the job environment (:class:`~trainmaster.jobs.settings.RuntimeSettings`),
* builds the trainer, or restores it from ``TRAINMASTER_RESUME_FROM`` (the latest good segment),
* runs the steps, re-seeding the global RNGs from ``(seed, step)`` before each one,
* every k steps captures the full state S_i and writes it (rank 0, on a background thread),
* records each segment's decision trace, which fixes the segment's leaf h_i,
* appends metrics to ``metrics.jsonl``,
* replays its last segment in a fresh process and fails unless it reproduces
  (:mod:`trainmaster.jobs.selfcheck`: ``state()`` must capture everything the next steps read),
* at the end writes ``commitment.json``, ``model.safetensors`` (= weights_n) and ``result.json``.

A run of N > 1 processes (``WORLD_SIZE``) records N in its states (``runtime/world_size``); a replay
re-executes one process, so such states are refused by the replay and the audit, and the self-check
does not run.

Formats: docs/runtime.md. Re-executing one segment: :mod:`trainmaster.jobs.replay`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import (
    MANIFEST,
    SEGMENTS,
    WEIGHTS,
    CheckpointError,
    LoadedSegment,
    read_segment,
    segment_dir,
    kept_indices,
    write_bytes_atomic,
)
from .commitment import FILENAME as COMMITMENT_FILE
from .commitment import Commitment, build_commitment
from .decisions import DecisionLog, DecisionTrace
from .execution import StateError, build_trainer, full_state, restore, run_step, state_info
from .metrics import FILENAME as METRICS_FILE
from .metrics import MetricsLog
from .recipe import Recipe, RecipeConfig, StepContext, Trainer
from .selfcheck import IMPORT_ONLY, TIMEOUT_FLOOR_S, TIMEOUT_SEGMENTS, SelfCheck
from .settings import RuntimeSettings, SettingsError
from .state import TrainState
from .writer import SegmentWriter

__all__ = [
    "Recipe",
    "RecipeConfig",
    "RunResult",
    "RuntimeSettings",
    "StepContext",
    "TrainState",
    "Trainer",
    "run",
]

MODEL_FILE = "model.safetensors"
RESULT_FILE = "result.json"
log = logging.getLogger("trainmaster.jobs")


@dataclass(frozen=True)
class RunResult:
    """What a finished run produced (``commitment`` is None on ranks other than 0)."""

    commitment: Commitment | None
    result: dict[str, Any]
    output_dir: Path


def run(recipe: Recipe, config: RecipeConfig, settings: RuntimeSettings | None = None) -> RunResult:
    """Train ``recipe`` with ``config`` under the job environment (or ``settings``) to the end."""
    if os.environ.get(IMPORT_ONLY):
        raise SettingsError(
            "run() was called while a recipe was being imported to replay it: start training only under "
            "`if __name__ == \"__main__\":`"
        )
    settings = settings or RuntimeSettings.from_env()
    k = settings.segment_steps
    if config.steps % k:
        raise SettingsError(f"steps ({config.steps}) must be a multiple of the segment length k ({k})")
    trainer = build_trainer(recipe, config, settings.seed)
    resumed = _resume_point(settings, recipe, config)
    start = 0
    if resumed is not None:
        restore(trainer, resumed.state)
        start = resumed.manifest.step
        if settings.is_writer:
            _say_resumed(resumed, config.steps)
    if not settings.is_writer:
        for step in range(start, config.steps):
            run_step(trainer, settings.seed, step, DecisionLog())
        return RunResult(None, trainer.result(), settings.output_dir)
    check = SelfCheck.start(recipe) if settings.selfcheck and settings.world_size == 1 else None
    if settings.selfcheck and check is None:
        log.warning("self-check skipped: a run of %d processes cannot be replayed by one", settings.world_size)
    try:
        return _train(trainer, recipe, config, settings, resumed, start, check)
    finally:
        if check is not None:
            check.close()


def _train(
    trainer: Trainer,
    recipe: Recipe,
    config: RecipeConfig,
    settings: RuntimeSettings,
    resumed: LoadedSegment | None,
    start: int,
    check: SelfCheck | None = None,
) -> RunResult:
    k, seed, n = settings.segment_steps, settings.seed, config.steps // settings.segment_steps
    world = settings.world_size
    if resumed is not None:
        _adopt_earlier_segments(resumed, settings.checkpoint_dir)
    _prepare_checkpoint_dir(settings.checkpoint_dir, resumed)
    metrics = MetricsLog(settings.output_dir / METRICS_FILE, resume_step=start if resumed else None)
    budget = None if settings.max_disk_gb is None else int(settings.max_disk_gb * 1e9)
    writer = SegmentWriter(settings.checkpoint_dir, job_id=settings.job_id, recipe=recipe.name, k=k,
                           budget_bytes=budget, used_bytes=_kept_bytes(settings.checkpoint_dir))
    if settings.keep_every > 1:
        _record_location(recipe, settings.checkpoint_dir)
    keep = _keeper(settings.keep_every, n)
    # S_i is written with the trace of the segment it starts, so it is held until that segment ends.
    held = None if resumed else writer.capture(full_state(trainer, recipe, config, seed, 0, world))
    segment_started, segment_seconds = time.perf_counter(), 0.0  # the last segment's time bounds the check's
    try:
        decisions = DecisionLog()
        for step in range(start, config.steps):
            produced = run_step(trainer, seed, step, decisions)
            if produced:
                metrics.append(step + 1, produced)
            if (step + 1) % k == 0:
                try:  # capture S_index before waking the writer, whose Python work would stall it on the GIL
                    reached = writer.capture(full_state(trainer, recipe, config, seed, step + 1, world))
                finally:  # the finished segment is queued even when S_index cannot be captured
                    if held is not None:  # None right after a resume: that segment is already on disk
                        writer.write((step + 1) // k - 1, held, decisions.trace, keep((step + 1) // k - 1))
                held = reached
                metrics.flush()
                decisions = DecisionLog()
                segment_seconds, segment_started = time.perf_counter() - segment_started, time.perf_counter()
        if held is not None:
            writer.write(n, held, DecisionTrace())
    except BaseException:
        with contextlib.suppress(CheckpointError):
            writer.close()  # let the good segments already queued reach the disk
        raise
    finally:
        metrics.close()
    writer.close()
    if check is not None:  # before the commitment: a run that does not reproduce commits to nothing
        waited = check.check(settings.checkpoint_dir, n - 1, k, TIMEOUT_FLOOR_S + TIMEOUT_SEGMENTS * segment_seconds)
        log.info("self-check: segment %d reproduced in a fresh process (%.2f s at the end of the run)", n - 1, waited)
    return _finish(trainer, recipe, config, settings, n)


def _finish(trainer: Trainer, recipe: Recipe, config: RecipeConfig, settings: RuntimeSettings, n: int) -> RunResult:
    """Write the commitment, the final weights and ``result.json``."""
    out, k = settings.output_dir, settings.segment_steps
    final_dir = segment_dir(settings.checkpoint_dir, n)
    final_weights = (final_dir / WEIGHTS).read_bytes()
    commitment = build_commitment(
        settings.checkpoint_dir, job_id=settings.job_id, bundle_sha256=settings.bundle_sha256, n=n, k=k,
        final_sha256=hashlib.sha256(final_weights).hexdigest(), record_environment=True,
    )
    write_bytes_atomic(out / COMMITMENT_FILE, commitment.canonical_json())
    write_bytes_atomic(out / MODEL_FILE, final_weights)
    result = {
        "recipe": recipe.name,
        "job_id": settings.job_id,
        "steps": config.steps,
        "k": k,
        "n": n,
        "final_checkpoint": str(final_dir),
        "final_weights": str(out / MODEL_FILE),
        "final_sha256": commitment.final_sha256,
        "commitment": str(out / COMMITMENT_FILE),
        **trainer.result(),
    }
    write_bytes_atomic(out / RESULT_FILE, (json.dumps(result, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return RunResult(commitment, result, out)


def _keeper(m: int, n: int):
    """Which segments keep their files: S_0, every m-th, S_{n-1} (the self-check replays it) and S_n."""
    return lambda i: i % m == 0 or i >= n - 1


def _kept_bytes(checkpoint_dir: Path) -> int:
    """What the segments already on disk take (a resumed run counts them against the budget)."""
    base = Path(checkpoint_dir) / SEGMENTS
    if not base.is_dir():
        return 0
    return sum(f.stat().st_size for f in base.glob("*/*.safetensors") if f.is_file() and not f.is_symlink())


def _record_location(recipe: Recipe, checkpoint_dir: Path) -> None:
    """Write how a fresh process imports the recipe, so the executor can re-make dropped states (jobs/reopen.py)."""
    from .reopen import write_location
    from .selfcheck import locate

    location = locate(recipe)
    if location is None:
        raise SettingsError(
            f"checkpoint.keep_every > 1 needs recipe {recipe.name!r} importable by a fresh process (defined at module "
            "level), to re-make the states it does not keep"
        )
    path = [os.path.abspath(entry or os.curdir) for entry in sys.path if isinstance(entry, str)]
    write_location(checkpoint_dir, {"attr": location.attr, "module": location.module, "script": location.script,
                                    "path": path, "python": sys.executable})


def _resume_point(settings: RuntimeSettings, recipe: Recipe, config: RecipeConfig) -> LoadedSegment | None:
    """The verified segment named by ``TRAINMASTER_RESUME_FROM``: a segment dir, or the latest in a checkpoint dir."""
    path = settings.resume_from
    if path is None:
        return None
    if not (path / MANIFEST).is_file():
        indices = kept_indices(path)
        if not indices:
            raise CheckpointError(f"nothing to resume from: {path} holds no complete segment")
        path = segment_dir(path, indices[-1])
    loaded = read_segment(path)
    info = state_info(loaded.state, world_size=None)
    expected = (recipe.name, config.model_dump(mode="json"), settings.seed, settings.segment_steps, settings.world_size)
    found = (info.recipe, info.config, info.seed, loaded.manifest.k, info.world_size)
    if found != expected:
        raise StateError(
            f"cannot resume from {path}: it was trained as (recipe, config, seed, k, processes) = {found}, not {expected}"
        )
    if info.step != loaded.manifest.step or info.step % settings.segment_steps:
        raise StateError(f"cannot resume from {path}: its step {info.step} is not its segment boundary")
    return loaded


def _say_resumed(resumed: LoadedSegment, steps: int) -> None:
    """One line in the job's log: where the run resumed, and that the metrics before it are kept."""
    m = resumed.manifest
    print(f"[trainmaster] resumed at step {m.step} of {steps} from segment {m.segment} ({resumed.directory}); "
          f"metrics.jsonl keeps its lines up to step {m.step}", file=sys.stderr, flush=True)


def _adopt_earlier_segments(resumed: LoadedSegment, checkpoint_dir: Path) -> None:
    """Copy segments 0..i into this attempt's checkpoint dir when resuming from another one."""
    source_root = resumed.directory.parent.parent
    if source_root.resolve() == Path(checkpoint_dir).resolve():
        return
    for i in range(resumed.manifest.segment + 1):
        target = segment_dir(checkpoint_dir, i)
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(segment_dir(source_root, i), tmp)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)


def _prepare_checkpoint_dir(checkpoint_dir: Path, resumed: LoadedSegment | None) -> None:
    """Drop segments this run will (re)write: all of them on a fresh start, those after the resume point otherwise."""
    base = Path(checkpoint_dir) / SEGMENTS
    keep = -1 if resumed is None else resumed.manifest.segment
    stale = [p for p in base.iterdir() if not (p.name.isdigit() and int(p.name) <= keep)] if base.is_dir() else []
    if stale and resumed is None:
        log.warning("fresh start: removing %d segments of an earlier run in %s", len(stale), base)
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()

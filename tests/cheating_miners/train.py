"""A job's training, run for real but altered: what a training cheat (miners.py) runs in place of the
job's entrypoint.

    python -m cheating_miners.train KIND --stash DIR -- python -m RECIPE_MODULE OPTIONS...

The recipe module's own command line runs under the project's runtime (jobs/runtime.py), with one of
the runtime's pieces wrapped:

- skip_half: the steps of the second half of the segments are not run; their states are the last trained
  state (step counter moved on), committed like honest ones;
- freeze: the state at the end of segment FROZEN_AT has Adam's second moments inflated
  (tests/audit_support.py `frozen`) and training goes on from it, barely moving;
- reuse: the first job trains honestly and its outputs and segments are kept in DIR; every later job
  gets copies of them instead of training;
- nudge: the state at the end of segment FROZEN_AT has every weight pushed by NUDGE (a ten-thousandth of a
  typical update: within-τ poisoning, inside every bound sampling checks) and training goes on from it;
- w0: the run starts from a W0 of its own choosing (the recipe's model built with another seed) instead of the one
  the spec's recipe and seed produce, and trains honestly from it (S_0 commits that W0).

The runtime's self-check (replaying the last segment in a fresh process) is switched off for skip_half,
whose last segment is no training at all: a cheat does not check itself.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
from pathlib import Path

FROZEN_AT = 2
"""The segment boundary (S_i) whose Adam state the `freeze` cheat inflates (and whose weights `nudge` pushes)."""
NUDGE = 1e-7


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cheating_miners.train")
    parser.add_argument("kind", choices=["skip_half", "freeze", "reuse", "nudge", "w0"])
    parser.add_argument("--stash", type=Path, required=True)
    split = argv.index("--")
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    if command[:2] != ["python", "-m"] or len(command) < 3:
        parser.error(f"the job's entrypoint is not `python -m RECIPE ...`: {command}")
    from trainmaster.jobs.recipes import cli

    module = importlib.import_module(command[2])

    def run() -> int:
        return cli.main(module.RECIPE, command[2].rsplit(".", 1)[-1], command[3:])

    if args.kind == "reuse":
        return _reuse(args.stash, run)
    _wrap_runtime(args.kind)
    return run()


def _wrap_runtime(kind: str) -> None:
    from trainmaster.jobs import runtime

    train = runtime._train

    def altered(trainer, recipe, config, settings, resumed, start, check=None):
        k, half = settings.segment_steps, (config.steps // settings.segment_steps) // 2
        if kind == "skip_half":
            check = None  # run() closes the one it started
            runtime.run_step = _skipping(runtime.run_step, half * k)
        elif kind == "nudge":
            runtime.full_state = _nudging(runtime.full_state, FROZEN_AT * k)
        elif kind == "w0":
            runtime.full_state = _choosing_w0(runtime.full_state)
        else:
            runtime.full_state = _freezing(runtime.full_state, FROZEN_AT * k)
        return train(trainer, recipe, config, settings, resumed, start, check)

    runtime._train = altered


def _skipping(run_step, from_step: int):
    def skipped(trainer, seed, step, decisions):
        return None if step >= from_step else run_step(trainer, seed, step, decisions)

    return skipped


def _freezing(full_state, at_step: int):
    from audit_support import frozen
    from trainmaster.jobs.execution import restore

    def captured(trainer, recipe, config, seed, step, world_size=1):
        state = full_state(trainer, recipe, config, seed, step, world_size)
        if step != at_step:
            return state
        stalled = frozen(state.snapshot())
        restore(trainer, stalled)
        return full_state(trainer, recipe, config, seed, step, world_size)

    return captured


def _nudging(full_state, at_step: int):
    import torch

    from trainmaster.jobs.execution import restore
    from trainmaster.jobs.state import TrainState

    def captured(trainer, recipe, config, seed, step, world_size=1):
        state = full_state(trainer, recipe, config, seed, step, world_size)
        if step != at_step:
            return state
        snap = state.snapshot()
        pushed = {name: t + NUDGE * torch.sign(t) if t.is_floating_point() else t for name, t in snap.weights.items()}
        restore(trainer, TrainState(pushed, dict(snap.rest)))
        return full_state(trainer, recipe, config, seed, step, world_size)

    return captured


def _choosing_w0(full_state):
    from trainmaster.jobs.execution import build_trainer, restore
    from trainmaster.jobs.state import TrainState

    def captured(trainer, recipe, config, seed, step, world_size=1):
        state = full_state(trainer, recipe, config, seed, step, world_size)
        if step != 0:
            return state
        chosen = full_state(build_trainer(recipe, config, seed + 1), recipe, config, seed + 1, 0).snapshot().weights
        restore(trainer, TrainState(dict(chosen), dict(state.snapshot().rest)))
        return full_state(trainer, recipe, config, seed, step, world_size)

    return captured


def _reuse(stash: Path, run) -> int:
    from trainmaster.jobs.settings import RuntimeSettings

    settings = RuntimeSettings.from_env()
    places = {"outputs": settings.output_dir, "checkpoints": settings.checkpoint_dir}
    if not (stash / "done").exists():
        code = run()
        if code == 0:
            for name, place in places.items():
                shutil.copytree(place, stash / name, dirs_exist_ok=True)
            (stash / "done").touch()
        return code
    for name, place in places.items():
        shutil.copytree(stash / name, place, dirs_exist_ok=True)
    print("[cheat] returned the first job's run again", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The tiny-lm job many end-to-end tests run (a runtime recipe that commits, with an evaluator): its entrypoint
(`TINY_LM.format(steps=N)`), its job.yaml (`JOB.format(entrypoint=...)`) and its evaluate.py."""

from __future__ import annotations

TINY_LM = ("python -m trainmaster.jobs.recipes.tiny_lm --steps {steps} --d-model 32 --layers 1 --seq-len 16 "
           "--batch-size 8 --warmup 10")
JOB = """\
name: lm
entrypoint: {entrypoint}
seed: 3
checkpoint:
  segment_steps: 25
  selfcheck: false
verification:
  evaluator: python evaluate.py
  thresholds: {{finite: 1.0}}
"""
"""The shipped tiny-LM recipe passes its self-check (tests/jobs/recipes/test_recipes.py runs it so); these
tests prove what the broker, the backends and verification do with its run, so it is skipped here, as its spec
allows (`checkpoint.selfcheck: false`, docs/runtime.md): it costs each run a second start-up of torch, ~3 s of CPU.
`JOB_SELFCHECKED` is the same job as a user gets it by default."""
JOB_SELFCHECKED = JOB.replace("  selfcheck: false\n", "")
EVALUATOR = """\
import json, os
import numpy as np
from safetensors.numpy import load_file
weights = load_file(os.environ["TRAINMASTER_EVAL_CHECKPOINT"])
print(json.dumps({"finite": float(all(bool(np.isfinite(t).all()) for t in weights.values())),
                  "tensors": len(weights)}))
"""
"""Reads the weights with numpy, as an evaluator that needs no autograd may: importing torch for it would cost each
verification seconds of CPU."""


def short_job(selfcheck: bool = False) -> str:
    """The job.yaml of a shorter run of the same shape: 40 steps in 4 segments of 10 (as 100 steps in 4 of 25).
    For tests whose proof is about the segments (how many, which are challenged, what a cheat does to the
    second half of them) rather than about the training's length: each step costs ~0.1 s of CPU in the miner's
    run, again in the audit's replay and in the runtime's self-check."""
    return (JOB_SELFCHECKED if selfcheck else JOB).format(entrypoint=TINY_LM.format(steps=SHORT_STEPS)).replace(
        "  segment_steps: 25\n", f"  segment_steps: {SHORT_SEGMENT_STEPS}\n")


SHORT_STEPS, SHORT_SEGMENT_STEPS = 40, 10

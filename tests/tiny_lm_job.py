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
verification:
  evaluator: python evaluate.py
  thresholds: {{finite: 1.0}}
"""
EVALUATOR = """\
import json, os
from safetensors.torch import load_file
weights = load_file(os.environ["TRAINMASTER_EVAL_CHECKPOINT"])
print(json.dumps({"finite": float(all(bool(t.isfinite().all()) for t in weights.values())),
                  "tensors": len(weights)}))
"""

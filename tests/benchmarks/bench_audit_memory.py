"""Broker peak memory while auditing a ~100M-parameter state (issue #10: "≤ 2× the opened bytes").

A tiny-lm run of ~100M parameters (d_model 128 — the recipe's largest — and 504 blocks; 8 tokens ×
2 sequences, T = 2, k = 1) is trained and committed by the runtime, as an executor does. Its last
segment (S_1 → S_2, full Adam moments on both sides) is then audited in fresh child processes, each
measured as its peak RSS (VmHWM, reset through /proc/self/clear_refs after the imports) minus its RSS
just before (Linux only):

* **open**: what the audit opens for the segment, checked and parsed — ``open_checked`` (S_i,
  the trace, the weights of S_{i+1}) then ``open_next_state_checked`` (the rest of S_{i+1} and the
  next trace), both results held. "Opened bytes" are the sizes of the files those two calls read.
  Target: peak rise ≤ 2 × opened bytes, for ``open_checked`` alone (its own files) and for both.
* **audit**: ``run_audit`` on that one segment with ``LocalOpenings`` and an explicit τ (no
  calibration needed: the figure is memory, not the verdict), which also builds S_0 from the spec
  and re-executes the segment with the trainer's own model, gradients and Adam moments.
  Target: peak rise ≤ 2 × opened bytes (issue #10).
* **train**: what one training step of that model needs by itself (build the trainer, one step),
  measured the same way; "audit net of training" is the audit's rise minus this, the broker's own
  amplification over the trainer it must run anyway.

``run(smoke=True)`` does the same on 4 blocks (~0.8M parameters, files of a few MB).

Run: python tests/benchmarks/bench_audit_memory.py   (a few minutes, ~8 GiB of memory at the peak)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

MIB = 1024 * 1024
BUNDLE = "be" * 32
CONFIG = {"steps": 2, "d_model": 128, "heads": 4, "seq_len": 8, "batch_size": 2, "warmup": 1, "vocab": 32}
FULL_LAYERS, SMOKE_LAYERS = 504, 4
K = 1
TAU = 1.0

CHILD = """
import json, sys, time
from pathlib import Path
import torch
from trainmaster.jobs.commitment import read_commitment
from trainmaster.jobs.decisions import DecisionLog
from trainmaster.jobs.execution import build_trainer, run_step
from trainmaster.jobs.recipes import get_recipe
from trainmaster.verify.audit import run_audit
from trainmaster.verify.openings import LocalOpenings, OpeningLimits, open_checked, open_next_state_checked

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

args = json.loads(sys.argv[1])
recipe = get_recipe("tiny-lm")
config = recipe.config(args["config"])
commitment = read_commitment(Path(args["commitment"]))
openings = LocalOpenings(Path(args["checkpoints"]))
limits = OpeningLimits(**args["limits"])
index = args["segment"]
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS
baseline = status("VmRSS")
start = time.perf_counter()
if args["mode"] == "open":
    opening = open_checked(openings, commitment, index, limits)
    first = status("VmHWM") - baseline
    rest = open_next_state_checked(openings, opening, max_rest_bytes=limits.rest_bytes, max_trace_bytes=limits.trace_bytes)
    ok = len(opening.state.weights) + len(opening.state.rest) + len(rest) > 0
elif args["mode"] == "audit":
    report = run_audit(
        commitment=commitment, openings=openings, segments=[index], recipe=recipe, config=args["config"],
        seed=0, tau=args["tau"],
    )
    ok = report.passed
else:
    trainer = build_trainer(recipe, config, 0)
    run_step(trainer, 0, index * commitment.k, DecisionLog())
    ok = True
seconds = time.perf_counter() - start
print(json.dumps({"rise_kib": status("VmHWM") - baseline, "seconds": seconds, "ok": ok, **({"first_kib": first} if args["mode"] == "open" else {})}))
"""


def run(smoke: bool = False) -> dict[str, float]:
    config = {**CONFIG, "layers": SMOKE_LAYERS if smoke else FULL_LAYERS}
    with tempfile.TemporaryDirectory(prefix="bench-audit-memory-") as tmp:
        root = Path(tmp)
        parameters, limits = _train(config, root)
        segment = config["steps"] // K - 1  # the last: S_i and S_{i+1} both hold full Adam moments
        opened = _opened_bytes(root / "checkpoints", segment, next_rest=True)
        opened_first = _opened_bytes(root / "checkpoints", segment, next_rest=False)
        common = {"config": config, "commitment": str(root / "commitment.json"), "checkpoints": str(root / "checkpoints"),
                  "limits": limits, "segment": segment, "tau": TAU}
        measured = {mode: _measure({**common, "mode": mode}) for mode in ("open", "audit", "train")}
    for mode, figures in measured.items():
        if not figures["ok"]:
            raise RuntimeError(f"the {mode} measurement did not complete as expected (an honest run was rejected?)")
    rise = {mode: figures["rise_kib"] * 1024 for mode, figures in measured.items()}
    return {
        "parameters (M)": parameters / 1e6,
        "open_checked (S_i, trace, W_i+1): opened (MiB)": opened_first / MIB,
        "open_checked: peak rise (MiB)": measured["open"]["first_kib"] * 1024 / MIB,
        "open_checked: peak / its opened bytes": measured["open"]["first_kib"] * 1024 / opened_first,
        "opened bytes, + rest and trace of S_i+1 (MiB)": opened / MIB,
        "open + parse: peak rise (MiB)": rise["open"] / MIB,
        "open + parse: peak / opened bytes": rise["open"] / opened,
        "open + parse (s)": measured["open"]["seconds"],
        "whole audit: peak rise (MiB)": rise["audit"] / MIB,
        "whole audit: peak / opened bytes": rise["audit"] / opened,
        "whole audit (s)": measured["audit"]["seconds"],
        "one training step alone: peak rise (MiB)": rise["train"] / MIB,
        "audit net of training: peak rise (MiB)": (rise["audit"] - rise["train"]) / MIB,
        "audit net of training / opened bytes": (rise["audit"] - rise["train"]) / opened,
    }


def _train(config: dict, root: Path) -> tuple[int, dict[str, int]]:
    """Train and commit ``config`` with the runtime under ``root``; (parameter count, the audit's opening limits)."""
    from trainmaster.jobs.execution import build_trainer, full_state
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.jobs.runtime import RuntimeSettings
    from trainmaster.jobs.runtime import run as train
    from trainmaster.verify.openings import OpeningLimits

    recipe = get_recipe("tiny-lm")
    cfg = recipe.config(config)
    settings = RuntimeSettings(
        job_id="bench", output_dir=root, checkpoint_dir=root / "checkpoints", seed=0, segment_steps=K, bundle_sha256=BUNDLE,
    )
    train(recipe, cfg, settings)
    initial = full_state(build_trainer(recipe, cfg, 0), recipe, cfg, 0, 0)
    limits = OpeningLimits.for_job(recipe, cfg, initial, K)
    parameters = sum(t.numel() for t in initial.weights.values())
    return parameters, {"weights_bytes": limits.weights_bytes, "rest_bytes": limits.rest_bytes, "trace_bytes": limits.trace_bytes}


def _opened_bytes(checkpoints: Path, segment: int, *, next_rest: bool) -> int:
    """The sizes of the files an audit of ``segment`` reads: S_i, its trace and the weights of S_{i+1}
    (``open_checked``), and with ``next_rest`` the rest of S_{i+1} and its trace too (``open_next_state_checked``)."""
    from trainmaster.jobs.checkpoint import DECISIONS, REST, WEIGHTS, segment_dir

    here, after = segment_dir(checkpoints, segment), segment_dir(checkpoints, segment + 1)
    files = [here / WEIGHTS, here / REST, here / DECISIONS, after / WEIGHTS] + ([after / REST, after / DECISIONS] if next_rest else [])
    return sum(path.stat().st_size for path in files)


def _measure(args: dict) -> dict:
    """Run the child for ``args["mode"]`` in a fresh interpreter and return its memory and time."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {args['mode']} child failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    figures = run(smoke="--smoke" in sys.argv)
    print_figures("audit memory: one segment of a ~100M-parameter tiny-lm", figures,
                  {"open_checked: peak / its opened bytes": "≤ 2", "open + parse: peak / opened bytes": "≤ 2",
                   "whole audit: peak / opened bytes": "≤ 2"})

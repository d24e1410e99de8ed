"""The training runtime's costs: checkpointing with state hashing, and its overhead on a training loop.

Figures:

* Checkpoint + hashing of a 100M-parameter fp32 model with its Adam state (1.2 GB: weights, two
  moments, step counts) with ``write_segment`` — canonical serialization, sha256 of weights and of
  rest ‖ trace, write, fsync, atomic publish — against ``safetensors.torch.save_file`` of the same
  tensors (weights and optimizer state as two files), without and with an fsync of both files (the
  runtime's checkpoints are durable; a bare save_file is not). Median of 3 after a warm-up round,
  files removed between runs. Target: ratio to the bare save_file <= 1.5. Smoke: 1M parameters.
* Steps/s of the DQN recipe under the runtime with a segment every k = 25 steps (whole runs: build,
  3000 steps, commitment), against building the trainer and running the same steps through the same
  step function without checkpoints. The machine is shared, so runs alternate and the overhead is
  the median over 7 pairs of the per-pair time ratio. Target: overhead <= 10 %. Smoke: 100 steps, once.
* The same cost taken apart, measured alternately in one process (immune to the machine's drift):
  the training thread's checkpoint work per segment, and the writer's CPU per segment, each as a
  percentage of the 25 steps the segment holds (after 1500 steps, so the replay buffer is full-ish).

Run: python tests/benchmarks/bench_runtime.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.checkpoint import write_segment, write_segment_bytes
from trainmaster.jobs.decisions import DecisionLog
from trainmaster.jobs.execution import build_trainer, full_state, run_step
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.runtime import RuntimeSettings, run as run_job
from trainmaster.jobs.state import TrainState
from trainmaster.jobs.writer import SerializedState

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

TARGETS = {"checkpoint / save_file ratio": "<= 1.5", "DQN overhead (%)": "<= 10"}


def run(smoke: bool = False) -> dict[str, float]:
    figures = _checkpoint_figures(params=1_000_000 if smoke else 100_000_000, repeats=1 if smoke else 3)
    figures.update(_overhead_figures(steps=100 if smoke else 3000, pairs=1 if smoke else 7))
    figures.update(_segment_cost_figures(warmup=100 if smoke else 1500, segments=2 if smoke else 40))
    return figures


def _adam_state(params: int) -> TrainState:
    """``params`` fp32 weights in 10 tensors, and Adam's two moments and step count for each."""
    generator = torch.Generator().manual_seed(0)
    weights = {f"layers.{i}.weight": torch.randn(params // 10, generator=generator) for i in range(10)}
    rest = {}
    for name, tensor in weights.items():
        rest[f"optimizer/state/{name}/exp_avg"] = torch.randn(tensor.shape, generator=generator) * 1e-3
        rest[f"optimizer/state/{name}/exp_avg_sq"] = torch.rand(tensor.shape, generator=generator) * 1e-6
        rest[f"optimizer/state/{name}/step"] = torch.tensor(100.0)
    return TrainState(weights=weights, rest=rest)


def _checkpoint_figures(params: int, repeats: int) -> dict[str, float]:
    state = _adam_state(params)
    bare, durable, ours = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        root = Path(tmp)
        files = [root / "weights.safetensors", root / "rest.safetensors"]
        for i in range(repeats + 1):  # the first round warms up the allocator and the page cache
            start = time.perf_counter()
            save_file(state.weights, files[0])
            save_file(state.rest, files[1])
            saved = time.perf_counter()
            for path in files:
                os.fsync(fd := os.open(path, os.O_RDONLY))
                os.close(fd)
            synced = time.perf_counter()
            for path in files:
                path.unlink()
            start_ours = time.perf_counter()
            write_segment(root / "ckpt", i, state, {}, job_id="bench", recipe="bench", step=0, k=25)
            done = time.perf_counter()
            shutil.rmtree(root / "ckpt")
            if i:
                bare.append(saved - start)
                durable.append(synced - start)
                ours.append(done - start_ours)
    size = sum(t.numel() * t.element_size() for part in (state.weights, state.rest) for t in part.values())
    ours_s, bare_s, durable_s = (statistics.median(x) for x in (ours, bare, durable))
    return {
        "checkpoint params (M)": params / 1e6,
        "checkpoint GB": size / 1e9,
        "save_file (s)": bare_s,
        "save_file + fsync (s)": durable_s,
        "checkpoint + hashes + fsync (s)": ours_s,
        "checkpoint / save_file ratio": ours_s / bare_s,
        "checkpoint / (save_file + fsync) ratio": ours_s / durable_s,
    }


def _bare_loop(steps: int) -> float:
    """The recipe's steps through the runtime's step function, without checkpoints; returns seconds."""
    recipe = get_recipe("dqn")
    config = recipe.config(_dqn_config(steps))
    start = time.perf_counter()
    trainer = build_trainer(recipe, config, 0)
    for step in range(steps):
        run_step(trainer, 0, step, DecisionLog())
    return time.perf_counter() - start


def _runtime_loop(steps: int, root: Path) -> float:
    recipe = get_recipe("dqn")
    settings = RuntimeSettings(output_dir=root / "out", checkpoint_dir=root / "ckpt", segment_steps=25)
    start = time.perf_counter()
    run_job(recipe, recipe.config(_dqn_config(steps)), settings)
    return time.perf_counter() - start


def _dqn_config(steps: int) -> dict[str, int]:
    return {"steps": steps, "learning_starts": steps // 5}


def _overhead_figures(steps: int, pairs: int) -> dict[str, float]:
    """Alternate runs without and with checkpoints; the machine is shared, so pair them and take medians."""
    bare, full = [], []
    _bare_loop(30)  # one-time costs (imports torch does on a first optimizer step, gymnasium's registry)
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        for i in range(pairs):
            bare.append(_bare_loop(steps))
            full.append(_runtime_loop(steps, Path(tmp) / str(i)))
    ratio = statistics.median(f / b for f, b in zip(full, bare, strict=True))
    return {
        "DQN steps per run": float(steps),
        "DQN steps/s, no checkpoints": steps / statistics.median(bare),
        "DQN steps/s, segment every 25 steps": steps / statistics.median(full),
        "DQN overhead (%)": 100.0 * (ratio - 1.0),
    }


def _segment_cost_figures(warmup: int, segments: int) -> dict[str, float]:
    """The checkpoint work of one DQN segment against the 25 steps it follows, measured side by side.

    The shared machine's speed drifts by tens of percent between runs; costs measured alternately
    within one process are not affected by that. Training thread: capturing and serializing S_i.
    Writer thread: CPU of serializing the trace, hashing, writing, fsyncing and publishing.
    """
    recipe = get_recipe("dqn")
    config = recipe.config(_dqn_config(warmup + 25 * segments))
    trainer = build_trainer(recipe, config, 0)
    for step in range(warmup):
        run_step(trainer, 0, step, DecisionLog())
    steps_s = capture_s = writer_cpu_s = 0.0
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        for i in range(segments):
            decisions, start = DecisionLog(), time.perf_counter()
            for step in range(warmup + 25 * i, warmup + 25 * (i + 1)):
                run_step(trainer, 0, step, decisions)
            captured = time.perf_counter()
            held = SerializedState.of(full_state(trainer, recipe, config, 0, warmup + 25 * (i + 1)))
            done = time.perf_counter()
            cpu = time.thread_time()
            write_segment_bytes(Path(tmp), i, [held.weights], [held.rest], [serialize(decisions.trace.to_tensors())],
                                job_id="bench", recipe="dqn", step=0, k=25)
            writer_cpu_s += time.thread_time() - cpu
            steps_s, capture_s = steps_s + captured - start, capture_s + done - captured
    return {
        "DQN segment: training-thread checkpoint work (% of 25 steps)": 100.0 * capture_s / steps_s,
        "DQN segment: writer CPU, this thread only (% of 25 steps)": 100.0 * writer_cpu_s / steps_s,
    }


if __name__ == "__main__":
    print_figures("Training runtime (issue #3)", run(), TARGETS)

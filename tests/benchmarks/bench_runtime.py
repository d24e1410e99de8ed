"""The training runtime's costs: checkpointing with state hashing, and its overhead on a training loop.

Figures:

* Checkpoint + hashing of a 100M-parameter fp32 model with its Adam state (1.2 GB: weights, two
  moments, step counts) with ``write_segment`` — canonical serialization, sha256 of weights and of
  rest ‖ trace, write, fsync, atomic publish — against ``safetensors.torch.save_file`` of the same
  tensors (weights and optimizer state as two files), without and with an fsync of both files (the
  runtime's checkpoints are durable; a bare save_file is not). Median of 3 after a warm-up round,
  files removed between runs. Target: ratio to the bare save_file <= 1.5. Smoke: 1M parameters.
  Also printed, as a ratio to the bare save_file, the floor on this machine of any checkpoint that
  sha256es every byte and writes it, with both spread perfectly over every core
  (tests/benchmarks/bench_trust.py pairs rounds against save_file for issue 35's figure). And
  the part of a checkpoint the training loop waits for under the runtime (the canonical copy of
  the state; hashing, writing and fsync happen on the writer thread) against the bare save_file.
* Steps/s of the DQN recipe under the runtime with a segment every k = 25 steps, against the same
  steps without checkpoints, measured in **lockstep**: the runtime trains a DQN trainer that, at
  every step, also steps an identical bare twin (built by ``build_trainer``, stepped by ``run_step``,
  as a script without the runtime would) and times the twin alone; the order alternates each step.
  The runtime's time is the whole ``run`` (build, S_0, every segment, commitment, final files) less
  the twin's. Whole runs timed one after another cannot resolve 10 % here: on this shared 2-core VM
  two identical bare runs in a row differ by up to 1.76x, while lockstep runs agree within ~2 %.
  The writer thread works concurrently, so the part of its contention that lands in twin steps is
  not charged to the runtime; the writer's whole CPU per segment is printed beside it as the bound
  on that. Median of 3 runs of 3000 steps. Target: overhead <= 10 %. Smoke: 100 steps, once.
* The per-segment cost taken apart, measured alternately in one process: the training thread's
  checkpoint work per segment, and the CPU of writing it (all threads), each as a percentage of
  the 25 steps the segment holds (after 1500 steps, so the replay buffer is full-ish).
* The end-of-run self-check (jobs/selfcheck.py; the lockstep runs above have it off, as settings
  built by hand do): whole DQN runs of 3000 steps with it and without, alternately (median of 3
  each; whole runs are noisy here, see above), the time the run waits for it at its end (the
  replay of the last segment in the process started with the run), and that process's CPU time
  (interpreter, torch and recipe imports while the run trains, then the segment).

Run: python tests/benchmarks/bench_runtime.py
"""

from __future__ import annotations

import hashlib
import logging
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.checkpoint import write_segment, write_segment_bytes
from trainmaster.jobs.decisions import DecisionLog
from trainmaster.jobs.execution import BUILD_STREAM, build_trainer, full_state, run_step
from trainmaster.jobs.recipe import Recipe, RecipeConfig, StepContext
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.runtime import RuntimeSettings, run as run_job
from trainmaster.jobs.seeding import seed_globals
from trainmaster.jobs.state import TrainState
from trainmaster.jobs.writer import SerializedState, StateBuffers

sys.path.insert(0, str(Path(__file__).parent))
from _common import median_seconds, print_figures  # noqa: E402

TARGETS = {"checkpoint / save_file ratio": "<= 1.5", "DQN overhead (%)": "<= 10"}


def run(smoke: bool = False) -> dict[str, float]:
    figures = _checkpoint_figures(params=1_000_000 if smoke else 100_000_000, repeats=1 if smoke else 3)
    figures.update(_overhead_figures(steps=100 if smoke else 3000, runs=1 if smoke else 3))
    figures.update(_segment_cost_figures(warmup=100 if smoke else 1500, segments=2 if smoke else 40))
    figures.update(_selfcheck_figures(steps=100 if smoke else 3000, runs=1 if smoke else 3))
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
    bare, durable, ours, blocked = [], [], [], []
    buffers = StateBuffers()
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
            start_copy = time.perf_counter()
            copy = SerializedState.of(state, buffers)  # what the runtime's training thread waits for
            copied = time.perf_counter()
            buffers.give_back(copy.weights)
            buffers.give_back(copy.rest)
            if i:
                blocked.append(copied - start_copy)
                bare.append(saved - start)
                durable.append(synced - start)
                ours.append(done - start_ours)
    size = sum(t.numel() * t.element_size() for part in (state.weights, state.rest) for t in part.values())
    ours_s, bare_s, durable_s, blocked_s = (statistics.median(x) for x in (ours, bare, durable, blocked))
    rate, cores = _sha256_bytes_per_second(state), os.cpu_count() or 1
    return {
        "checkpoint params (M)": params / 1e6,
        "checkpoint GB": size / 1e9,
        "save_file (s)": bare_s,
        "save_file + fsync (s)": durable_s,
        "checkpoint + hashes + fsync (s)": ours_s,
        "checkpoint / save_file ratio": ours_s / bare_s,
        "checkpoint / (save_file + fsync) ratio": ours_s / durable_s,
        "training thread blocked per checkpoint / save_file": blocked_s / bare_s,
        "sha256 GB/s, one core": rate / 1e9,
        "floor: (sha256 of every byte + save_file) on all cores / save_file": (size / rate + bare_s) / cores / bare_s,
    }


def _sha256_bytes_per_second(state: TrainState) -> float:
    """sha256 throughput of one core over the largest tensor's bytes (best of 3)."""
    data = memoryview(max(state.rest.values(), key=torch.Tensor.numel).numpy()).cast("B")
    best = min(median_seconds(lambda: hashlib.sha256(data), 1) for _ in range(3))
    return len(data) / best


class _LockstepTrainer:
    """A DQN trainer that, at every step, also steps an identical bare twin and times the twin alone.

    The twin is built and stepped the way a script without the runtime would (``build_trainer``,
    ``run_step`` with its own decision log). The two take turns going first, so neither always
    finds the caches warm. DQN draws only from its step's own generators, and ``run_step`` seeds
    the global ones from ``(seed, step)``, so the twin's step leaves the runtime's trainer exactly
    where an ordinary run would: its checkpoints are those of a plain DQN run.
    """

    def __init__(self, config: RecipeConfig, seed: int):
        dqn = get_recipe("dqn")
        start = time.perf_counter()
        self.twin = build_trainer(dqn, config, seed)
        self.twin_seconds = time.perf_counter() - start
        self.twin_log = DecisionLog()
        seed_globals(seed, 0, BUILD_STREAM)  # as the runtime's build_trainer left them for this build
        self.own = dqn.build(config, seed)

    def step(self, ctx: StepContext) -> Mapping[str, float] | None:
        if ctx.step % 2:
            produced = self.own.step(ctx)
        start = time.perf_counter()
        run_step(self.twin, ctx.seed, ctx.step, self.twin_log)
        self.twin_seconds += time.perf_counter() - start
        if not ctx.step % 2:
            produced = self.own.step(ctx)
        return produced

    def state(self) -> TrainState:
        return self.own.state()

    def load_state(self, state: TrainState) -> None:
        self.own.load_state(state)

    def result(self) -> dict[str, Any]:
        return self.own.result()


def _lockstep_run(steps: int, k: int, root: Path) -> tuple[float, float]:
    """One runtime run of DQN in lockstep with its bare twin: (runtime seconds, twin seconds)."""
    built: list[_LockstepTrainer] = []

    def build(config: RecipeConfig, seed: int) -> _LockstepTrainer:
        built.append(_LockstepTrainer(config, seed))
        return built[-1]

    dqn = get_recipe("dqn")
    recipe = Recipe(name=dqn.name, config_type=dqn.config_type, build=build)
    settings = RuntimeSettings(output_dir=root / "out", checkpoint_dir=root / "ckpt", segment_steps=k)
    start = time.perf_counter()
    run_job(recipe, recipe.config(_dqn_config(steps)), settings)
    total = time.perf_counter() - start
    return total - built[0].twin_seconds, built[0].twin_seconds


def _dqn_config(steps: int) -> dict[str, int]:
    return {"steps": steps, "learning_starts": steps // 5}


def _overhead_figures(steps: int, runs: int) -> dict[str, float]:
    """Median over ``runs`` lockstep runs with a segment every 25 steps."""
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        _lockstep_run(50, 25, Path(tmp) / "warm-up")  # one-time costs: the first optimizer step's imports
        samples = [_lockstep_run(steps, 25, Path(tmp) / str(i)) for i in range(runs)]
    return {
        "DQN steps per run": float(steps),
        "DQN steps/s, no checkpoints (twin)": steps / statistics.median(twin for _, twin in samples),
        "DQN steps/s, segment every 25 steps": steps / statistics.median(ours for ours, _ in samples),
        "DQN overhead (%)": statistics.median(100.0 * (ours / twin - 1.0) for ours, twin in samples),
    }


def _segment_cost_figures(warmup: int, segments: int) -> dict[str, float]:
    """The checkpoint work of one DQN segment against the 25 steps it follows, measured side by side.

    The shared machine's speed drifts by tens of percent between runs; costs measured alternately
    within one process are not affected by that. Training thread: capturing and serializing S_i.
    Writing: CPU of serializing the trace, hashing, writing, fsyncing and publishing, in every
    thread (the hashers and fsyncers too), run synchronously so nothing else is counted.
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
            cpu = time.process_time()
            write_segment_bytes(Path(tmp), i, [held.weights], [held.rest], [serialize(decisions.trace.to_tensors())],
                                job_id="bench", recipe="dqn", step=0, k=25)
            writer_cpu_s += time.process_time() - cpu
            steps_s, capture_s = steps_s + captured - start, capture_s + done - captured
    return {
        "DQN segment: training-thread checkpoint work (% of 25 steps)": 100.0 * capture_s / steps_s,
        "DQN segment: writing CPU, all threads (% of 25 steps)": 100.0 * writer_cpu_s / steps_s,
    }


class _Waits(logging.Handler):
    """The seconds the runtime reports waiting for its self-check (its INFO line)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.seconds: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("self-check:"):
            self.seconds.append(float(record.args[-1]))


def _selfcheck_figures(steps: int, runs: int) -> dict[str, float]:
    dqn = get_recipe("dqn")
    config = dqn.config(_dqn_config(steps))
    waits, logger = _Waits(), logging.getLogger("trainmaster.jobs")
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(waits)
    wall: dict[bool, list[float]] = {True: [], False: []}
    child_cpu = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
            for i in range(runs):
                for on in (False, True) if i % 2 else (True, False):
                    root = Path(tmp) / f"{i}-{on}"
                    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
                    run_job(dqn, config, RuntimeSettings(output_dir=root / "out", checkpoint_dir=root / "ckpt",
                                                         segment_steps=25, selfcheck=on))
                    wall[on].append(time.perf_counter() - start)
                    after = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if on:
                        child_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    finally:
        logger.removeHandler(waits)
        logger.level = level
    with_check, without = statistics.median(wall[True]), statistics.median(wall[False])
    return {
        "DQN whole run, no self-check (s)": without,
        "DQN whole run, with self-check (s)": with_check,
        "self-check: whole-run difference (%)": 100.0 * (with_check / without - 1.0),
        "self-check: wait at the end of the run (s)": statistics.median(waits.seconds),
        "self-check: wait at the end (% of the run without it)": 100.0 * statistics.median(waits.seconds) / without,
        "self-check: its process's CPU (s)": statistics.median(child_cpu),
    }


if __name__ == "__main__":
    print_figures("Training runtime (issue #3)", run(), TARGETS)

"""A GPT-style model under the runtime against a bare loop: the fraction of step time blocked by checkpoints.

The job's own GPT recipe of the GPU check (tests/gpu/gpt_job/gpt.py) trains T steps twice from the same
seed: a bare loop (``build_trainer`` + ``run_step``), then ``runtime.run`` with k = 25 and the self-check
off. In the second run the calls through which the training loop hands states to the checkpoint writer
are timed — ``SegmentWriter.capture`` (the canonical copy of S_i: on a GPU, the device-to-device snapshot
and the start of the asynchronous copy into pinned memory, jobs/host_copy.py), ``write`` (the hand-over,
which waits when the writer is two segments behind) and ``close`` (the wait for the last writes) — and
their sum is divided by the run's time. Target: ≤ 5 %. Printed too: each capture after the first (the first
ones allocate pinned memory) and the steady state, one capture and one hand-over against a segment of bare steps.

On a machine with CUDA it runs the GPU check's size (86M parameters: d 768, 12 layers, seq 256, batch 32,
T = 100); without one, a small model on the CPU (the figure is then the CPU path's). The GPU check
(tests/gpu/check.py, stage ``gpt_benchmark``) runs this on the H200.

Run: python tests/benchmarks/bench_gpt_blocked.py
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

GPT_DIR = Path(__file__).resolve().parents[1] / "gpu" / "gpt_job"
K = 25
GPU_SIZES = {"d-model": 768, "layers": 12, "heads": 12, "seq-len": 256, "batch-size": 32, "vocab": 512, "threads": 16}
CPU_SIZES = {"d-model": 64, "layers": 2, "heads": 4, "seq-len": 32, "batch-size": 8, "vocab": 64}
SMOKE_SIZES = {"d-model": 16, "layers": 1, "heads": 2, "seq-len": 8, "batch-size": 2, "vocab": 16}


def options(sizes: dict, steps: int) -> list[str]:
    words = ["--steps", str(steps)]
    for key, value in sizes.items():
        words += [f"--{key}", str(value)]
    return words


def measure(sizes: dict, steps: int, work: Path, seed: int = 5, found: dict | None = None) -> dict[str, float]:
    """Bare loop and runtime over the same model; the blocked time and fractions (see the module docstring).
    ``found`` receives the runtime run's ``final_sha256`` and commitment ``device``."""
    if str(GPT_DIR) not in sys.path:
        sys.path.insert(0, str(GPT_DIR))
    from gpt import RECIPE

    from trainmaster.jobs import writer as writer_module
    from trainmaster.jobs.decisions import DecisionLog
    from trainmaster.jobs.devices import synchronize
    from trainmaster.jobs.execution import build_trainer, run_step
    from trainmaster.jobs.recipes.options import parse_options
    from trainmaster.jobs.runtime import RuntimeSettings, run

    config = parse_options(RECIPE, options(sizes, steps))
    warm = build_trainer(RECIPE, config, seed)  # kernels, cuBLAS handles, the allocator's pools
    for step in range(3):
        run_step(warm, seed, step, DecisionLog())
    device = warm.device
    synchronize(device)
    del warm
    began = time.perf_counter()
    trainer = build_trainer(RECIPE, config, seed)
    for step in range(steps):
        run_step(trainer, seed, step, DecisionLog())
    synchronize(device)
    bare = time.perf_counter() - began
    del trainer
    each: dict[str, list[float]] = {"capture": [], "write": [], "close": []}  # every call's seconds
    originals = {name: getattr(writer_module.SegmentWriter, name) for name in each}

    def timed(name):
        def call(self, *args, **kwargs):
            started = time.perf_counter()
            try:
                return originals[name](self, *args, **kwargs)
            finally:
                each[name].append(time.perf_counter() - started)
        return call

    out = Path(work) / "bench-gpt"
    shutil.rmtree(out, ignore_errors=True)
    for name in each:
        setattr(writer_module.SegmentWriter, name, timed(name))
    try:
        began = time.perf_counter()
        result = run(RECIPE, config, RuntimeSettings(output_dir=out, checkpoint_dir=out / "checkpoints", segment_steps=K,
                                                     seed=seed, selfcheck=False))
        synchronize(device)
        runtime = time.perf_counter() - began
    finally:
        for name, original in originals.items():
            setattr(writer_module.SegmentWriter, name, original)
    state_bytes = sum(p.stat().st_size for p in (out / "checkpoints" / "segments" / "00000001").iterdir())
    if found is not None:
        found.update(final_sha256=result.commitment.final_sha256, device=result.commitment.device_kind)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "device cuda (1) or cpu (0)": float(device.type == "cuda"),
        "parameters (M)": result.result["parameters"] / 1e6,
        "steps": float(steps),
        "state per segment (MB)": state_bytes / 1e6,
        "bare loop (s)": bare,
        "runtime (s)": runtime,
        "runtime overhead (%)": 100 * (runtime / bare - 1),
        "blocked in capture (s)": sum(each["capture"]),
        "blocked in hand-over (s)": sum(each["write"]),
        "blocked at close (s)": sum(each["close"]),
        "blocked fraction of step time (%)": 100 * sum(map(sum, each.values())) / runtime,
        "captures": float(len(each["capture"])),
        "first capture (s)": each["capture"][0] if each["capture"] else 0.0,
        "later captures, median (s)": _median(each["capture"][1:]),
        "later captures, max (s)": max(each["capture"][1:], default=0.0),
        "hand-overs, median (s)": _median(each["write"]),
        # a segment of a long run: one capture and one hand-over against k bare steps (the first capture, which
        # allocates the pinned buffers, and the final flush are once per run)
        "steady-state blocked per segment (%)": 100 * (_median(each["capture"][1:]) + _median(each["write"]))
        / (K * bare / steps),
        "final weights sha256 prefix": float(int(result.commitment.final_sha256[:8], 16)),
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def run(smoke: bool = False) -> dict[str, float]:
    import torch

    gpu = torch.cuda.is_available() and not smoke
    sizes = SMOKE_SIZES if smoke else GPU_SIZES if gpu else CPU_SIZES
    steps = K * (2 if smoke else 4 if gpu else 8)
    with tempfile.TemporaryDirectory() as tmp:
        return measure(sizes, steps, Path(tmp))


if __name__ == "__main__":
    print_figures("GPT-style model: runtime (k = 25) against a bare loop, time blocked by checkpoints", run())

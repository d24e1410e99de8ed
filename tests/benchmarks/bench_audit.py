"""Replay audit: its cost as a fraction of training, and the separation table R(k), for DQN and tiny-lm.

1. Separation: :func:`trainmaster.verify.calibrate.calibrate` per job, as `trainmaster verify calibrate`
   does by default (3 seeds × 4 base states across the run, from where learning starts; honest variants:
   other thread count, one-ulp nudge, float64; mildest cheat: lr × 0.9) at k ∈ {10, 25, 50, 100}:
   honest p99 r, the cheat's min r, R = min cheat / p99, τ = sqrt(p99 · min cheat).
2. Cost: train T steps with the runtime (checkpoints every k = 25, as an executor does), then audit
   q = 8 drawn segments plus the first and last with that calibration (median of 3 audits); the
   audit's wall time over the training's. Ideal (q+2)·k/T; target ≤ 1.25× that, and ≤ 5 % at q = 8, k = 25, T = 10,000.
   The ratio of process CPU times is shown too: on a shared machine the two wall times see
   different contention, the CPU times much less so.
3. The whole pipeline: ``verify_attempt`` on those outputs as an untrusted, signed executor's
   (integrity with every recorded output re-hashed, the safety scan of every file in its child
   process, the replay audit with the stored calibration, the outcome); target ≤ 5 % of training.
   Its CPU time counts the safety child's. Twice: with the checkpoints in the outputs (every
   segment file goes through the safety scan, headers only: 1,203 files, 57,000 tensor entries for
   DQN), and with the segments kept by the executor and opened on request, as a remote executor
   does (only the challenged ones are ever read); each the median of ``repeat`` runs after one
   untimed run, as the broker is a long-running process (the first run imports the signing,
   storage and pipeline modules: about 1.5 s of CPU once).

Run: python tests/benchmarks/bench_audit.py   (several minutes; smoke: a few seconds)
"""

from __future__ import annotations

import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

BUNDLE = "be" * 32
KS = (10, 25, 50, 100)
AUDIT_K, Q = 25, 8
JOBS = {
    # name: (recipe, config, no calibration base before this step)
    "dqn": ("dqn", {"steps": 10_000}, 0),
    "tiny-lm": ("tiny-lm", {"steps": 10_000, "d_model": 32, "heads": 4, "seq_len": 32, "batch_size": 8}, 0),
}
SMOKE_K = 10
SMOKE_JOBS = {
    "dqn": ("dqn", {"steps": 100, "learning_starts": 30, "buffer_size": 200, "batch_size": 16}, 40),
    "tiny-lm": ("tiny-lm", {"steps": 40, "d_model": 16, "heads": 2, "layers": 1, "seq_len": 16, "batch_size": 4}, 10),
}


def separation(recipe: str, config: dict, warmup: int, ks: tuple[int, ...], seeds: int):
    from trainmaster.verify.calibrate import calibrate

    return calibrate(recipe, config, ks=ks, seeds=range(seeds), warmup=warmup)


def audit_cost(recipe_name: str, config: dict, calibration, k: int, q: int, root: Path, repeat: int) -> dict[str, float]:
    """Train with the runtime, then audit the drawn segments (median of ``repeat`` audits); times and ratios."""
    from trainmaster.jobs.commitment import read_commitment
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.jobs.runtime import RuntimeSettings, run
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.challenge import draw_segments
    from trainmaster.verify.openings import LocalOpenings

    recipe = get_recipe(recipe_name)
    cfg = recipe.config(config)
    settings = RuntimeSettings(
        job_id="bench", output_dir=root / "out", checkpoint_dir=root / "out" / "checkpoints", seed=0,
        segment_steps=k, bundle_sha256=BUNDLE,
    )
    started, cpu = time.perf_counter(), time.process_time()
    run(recipe, cfg, settings)
    trained, trained_cpu = time.perf_counter() - started, time.process_time() - cpu
    commitment = read_commitment(root / "out" / "commitment.json")
    segments = draw_segments(b"bench-secret".ljust(32, b"."), commitment.root, commitment.n, q)
    audits = []
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        report = run_audit(
            commitment=commitment, openings=LocalOpenings(root / "out" / "checkpoints"), segments=segments,
            recipe=recipe, config=cfg, seed=0, calibration=calibration,
        )
        audits.append((time.perf_counter() - started, time.process_time() - cpu))
    audited, audited_cpu = (statistics.median(times) for times in zip(*audits))
    ideal = len(segments) * k / cfg.steps
    timed_pipeline(pipeline_attempt(recipe, cfg, calibration, k, q, root))  # warm-up: the broker runs on
    verdict, piped, piped_cpu = median_pipeline(lambda: pipeline_attempt(recipe, cfg, calibration, k, q, root), repeat)
    (root / "out" / "checkpoints").rename(root / "kept")  # a remote executor keeps them and opens the challenge
    remote, remote_piped, remote_cpu = median_pipeline(
        lambda: pipeline_attempt(recipe, cfg, calibration, k, q, root, openings=root / "kept"), repeat
    )
    return {
        "train (s)": trained,
        "audit (s)": audited,
        "audit / training": audited / trained,
        "audit / training, CPU time": audited_cpu / trained_cpu,
        "ideal (q+2)k/T": ideal,
        "target 1.25 (q+2)k/T": 1.25 * ideal,
        "audit passed": float(report.passed),
        "pipeline (s)": piped,
        "pipeline / training": piped / trained,
        "pipeline / training, CPU time": piped_cpu / trained_cpu,
        "pipeline accepted": float(verdict.outcome == "accepted"),
        "pipeline, segments opened on request / training": remote_piped / trained,
        "pipeline, segments opened on request / training, CPU time": remote_cpu / trained_cpu,
        "pipeline, segments opened on request, accepted": float(remote.outcome == "accepted"),
    }


def pipeline_attempt(recipe, config, calibration, k: int, q: int, root: Path, openings: Path | None = None):
    """The run under ``root`` as a signed untrusted executor's attempt, every output recorded (hashed as
    the broker does while fetching), and the settings to verify it with: ``(attempt, db path, audit settings)``.

    The challenged segments are opened from the outputs' checkpoints, or from ``openings`` (the
    executor's own copy, as a remote executor sends them once asked; the outputs then hold none).
    """
    from bittensor.sp_core import Keypair

    from trainmaster.jobs.commitment import read_commitment
    from trainmaster.jobs.recipes import MODULES
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.verify.calibration import store_calibration
    from trainmaster.verify.openings import LocalOpenings
    from trainmaster.verify.pipeline import Attempt, AuditSettings
    from trainmaster.jobs.files import sha256_file
    from trainmaster.jobs.signing import sign_commitment

    outputs = root / "out"
    options = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in config.model_dump().items())
    spec = JobSpec(
        name="bench", entrypoint=f"python -m trainmaster.jobs.recipes.{MODULES[recipe.name]} {options}",
        checkpoint={"segment_steps": k}, verification={"challenge_segments": q},
    )
    store_calibration(calibration, root / "calibration")
    miner = Keypair.create_from_mnemonic(Keypair.generate_mnemonic())
    files = sorted(p for p in outputs.rglob("*") if p.is_file())
    attempt = Attempt(
        job_id="bench", attempt_id="a1", outputs=outputs, bundle_sha256=BUNDLE, spec=spec, trusted=False,
        hotkey=miner.ss58_address, signature=sign_commitment(read_commitment(outputs / "commitment.json"), miner),
        recorded_outputs=tuple((p.relative_to(outputs).as_posix(), p.stat().st_size, sha256_file(p)) for p in files),
        openings=None if openings is None else LocalOpenings(openings),
    )
    (root / "state.db").unlink(missing_ok=True)
    return attempt, root / "state.db", AuditSettings(calibration_dir=root / "calibration")


def timed_pipeline(prepared) -> tuple:
    """``verify_attempt`` on a :func:`pipeline_attempt`: ``(verdict, wall seconds, CPU seconds with children)``."""
    from trainmaster.verify.pipeline import verify_attempt

    attempt, db_path, settings = prepared
    started, cpu = time.perf_counter(), _cpu_with_children()
    verdict = verify_attempt(attempt, db_path=db_path, audit_settings=settings, write_verdict=False)
    return verdict, time.perf_counter() - started, _cpu_with_children() - cpu


def median_pipeline(prepare, repeat: int) -> tuple:
    """:func:`timed_pipeline` ``repeat`` times (a fresh attempt each): the last verdict, the median wall and CPU
    seconds (on a shared machine one run's CPU time varies by ±20 %)."""
    runs = [timed_pipeline(prepare()) for _ in range(repeat)]
    return runs[-1][0], statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs)


def _cpu_with_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + usage.ru_utime + usage.ru_stime


def run(smoke: bool = False) -> dict[str, float]:
    jobs, ks, seeds, k, q, repeat = (SMOKE_JOBS, (SMOKE_K,), 1, SMOKE_K, 2, 1) if smoke else (JOBS, KS, 3, AUDIT_K, Q, 3)
    figures: dict[str, float] = {}
    for name, (recipe, config, warmup) in jobs.items():
        calibration = separation(recipe, config, warmup, ks, seeds)
        for p in calibration.points:
            figures[f"{name} k={p.k} honest p99 r"] = p.honest_p99
            figures[f"{name} k={p.k} min cheat r"] = p.cheat_min
            figures[f"{name} k={p.k} R"] = p.separation
            figures[f"{name} k={p.k} tau"] = p.tau
        with tempfile.TemporaryDirectory() as tmp:
            for key, value in audit_cost(recipe, config, calibration, k, q, Path(tmp), repeat).items():
                figures[f"{name} T={config['steps']} q={q} k={k}: {key}"] = value
    return figures


def print_separation(figures: dict[str, float]) -> None:
    print("\nseparation R(k) = min cheat r / honest p99 r   (τ = sqrt(p99 · min cheat); want R ≥ 10)")
    print(f"  {'job':<8} {'k':>4} {'honest p99 r':>13} {'min cheat r':>12} {'R':>9} {'tau':>10}")
    for name in JOBS:
        for k in KS:
            key = f"{name} k={k}"
            if f"{key} R" in figures:
                print(
                    f"  {name:<8} {k:>4} {figures[f'{key} honest p99 r']:>13.3g} {figures[f'{key} min cheat r']:>12.3g}"
                    f" {figures[f'{key} R']:>9.4g} {figures[f'{key} tau']:>10.3g}"
                )


if __name__ == "__main__":
    results = run()
    print_separation(results)
    costs = {k: v for k, v in results.items() if ": " in k}
    targets = {k: "≤ 1.25 (q+2)k/T and ≤ 0.05" for k in costs if k.endswith("audit / training")}
    targets.update({k: "≤ 0.05" for k in costs if k.endswith(("pipeline / training", "request / training"))})
    print_figures("audit and pipeline cost vs training (wall time, q = 8 + first + last, k = 25)", costs, targets)

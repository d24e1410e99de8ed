"""False rejects: honest-but-different executors audited segment by segment (target: 0 of ≥ 300 per recipe).

Per recipe, the class is calibrated as `trainmaster verify calibrate` does by default
(:func:`trainmaster.verify.calibrate.calibrate`: seeds 0, 1, 2, four base states per run — where
learning starts and three more spread to the run's end), which gives τ(k), the field tolerances, the
margin tolerance and the update floor and ceiling. Then, for other seeds, a whole run is trained by
each honest variant of ``verify/variants.py`` (threads, one ulp, float64), every segment by that
variant from its own previous state — early learning included (tiny-lm's warm-up, DQN's segments
before and just after ``learning_starts``, PPO's first rollouts) — committed, and every segment of it
audited with ``run_audit``. k = 25 for tiny-lm and DQN; k = 64 for PPO, one rollout, so that every
segment holds an update. Printed per recipe: rejections of N audited segments, the largest r/τ, the
largest r/tolerance over the state's ``tolerance``/``close``/``reported`` groups, and the update per
lr against the calibrated floor and ceiling.

Left out, and counted apart: the "ulp" variant on a segment whose re-execution updates nothing (DQN
before ``learning_starts``). That variant nudges S_i's weights by one ulp before running, so it
commits weights that differ from S_i where no step touched them, and the audit rejects it (r = ∞,
docs/audit.md: a segment without an update must leave the weights exactly as they were). Real
hardware cannot produce that: without arithmetic on the weights every executor leaves them
bit-identical; the threads and float64 variants, audited on those segments, show it.

Runs until each recipe has ``TARGET`` audited segments or its time budget is spent, whichever comes
first; the count says which.

Run: python tests/benchmarks/bench_false_rejects.py [RECIPE ...]   (about 20 minutes; smoke: seconds)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

TARGET, BUDGET_S = 300, 600.0
JOBS = {
    # name: (recipe, config, k)
    "tiny-lm": ("tiny-lm", {"steps": 500, "d_model": 16, "heads": 2, "layers": 1, "seq_len": 16, "batch_size": 4,
                            "threads": 1, "warmup": 50}, 25),
    "dqn": ("dqn", {"steps": 1000, "learning_starts": 200, "buffer_size": 2000, "batch_size": 64, "lr": 1e-3,
                    "hidden": 64}, 25),
    "ppo": ("ppo", {"steps": 768, "rollout": 64, "epochs": 2, "minibatch": 32, "lr": 1e-3, "hidden": 32}, 64),
}
SMOKE_JOBS = {
    "tiny-lm": ("tiny-lm", {"steps": 50, "d_model": 16, "heads": 2, "layers": 1, "seq_len": 16, "batch_size": 4,
                            "threads": 1, "warmup": 10}, 25),
    "dqn": ("dqn", {"steps": 100, "learning_starts": 30, "buffer_size": 200, "batch_size": 16}, 25),
}


def false_rejects(name: str, recipe_name: str, config: dict, k: int, target: int, budget_s: float, bases: int) -> dict[str, float]:
    from audit_support import commit, train, variant_segments
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.calibrate import calibrate
    from trainmaster.verify.openings import LocalOpenings
    from trainmaster.verify.variants import HONEST_VARIANTS

    recipe = get_recipe(recipe_name)
    started = time.perf_counter()
    calibration = calibrate(recipe, config, ks=[k], seeds=range(min(bases, 3)), bases=bases)
    calibrated_s = time.perf_counter() - started
    point = calibration.point(k)
    audited = rejected = unchanged = 0
    worst_r = worst_field = worst_ceiling = 0.0
    lowest_floor = float("inf")
    seed = 100
    while True:  # at least one seed, then until the target or the budget
        for variant in HONEST_VARIANTS:
            run = train(recipe, config, seed, k, variant_segments(recipe, k, variant))
            with tempfile.TemporaryDirectory() as tmp:
                report = run_audit(
                    commitment=commit(run, Path(tmp)), openings=LocalOpenings(Path(tmp)), segments=list(range(run.n)),
                    recipe=recipe, config=config, seed=seed, calibration=calibration,
                )
            for segment in report.segments:
                if variant.nudge_ulp and segment.update_norm == 0:
                    unchanged += 1  # see the module docstring: not an executor any hardware gives
                    continue
                audited += 1
                rejected += not segment.passed
                if not segment.passed:
                    print(f"  FALSE REJECT {name} seed {seed} {variant.name} segment {segment.index}: {segment.reasons}")
                worst_r = max(worst_r, segment.r / point.tau)
                worst_field = max([worst_field, *(f.r / f.tolerance for f in segment.fields.values() if f.tolerance)])
                if segment.update_per_lr is not None:
                    worst_ceiling = max(worst_ceiling, segment.update_per_lr / point.update_ceiling)
                    lowest_floor = min(lowest_floor, segment.update_per_lr / point.update_floor)
        seed += 1
        if audited >= target or time.perf_counter() - started >= budget_s:
            break
    return {
        f"{name}: false rejects": float(rejected),
        f"{name}: audited segments": float(audited),
        f"{name}: ulp segments without an update, left out": float(unchanged),
        f"{name}: runs (seeds x 3 variants)": float(3 * (seed - 100)),
        f"{name}: calibration bases": float(len(calibration.bases)),
        f"{name}: k": float(k),
        f"{name}: tau(k)": point.tau,
        f"{name}: largest r / tau": worst_r,
        f"{name}: largest field r / tolerance": worst_field,
        f"{name}: largest update per lr / ceiling": worst_ceiling,
        f"{name}: smallest update per lr / floor": lowest_floor,
        f"{name}: calibration seconds": calibrated_s,
        f"{name}: seconds": time.perf_counter() - started,
    }


def run(smoke: bool = False, names: list[str] | None = None) -> dict[str, float]:
    jobs, target, budget, bases = (SMOKE_JOBS, 1, 0.0, 1) if smoke else (JOBS, TARGET, BUDGET_S, 4)
    figures: dict[str, float] = {}
    for name, (recipe, config, k) in jobs.items():
        if names and name not in names:
            continue
        figures.update(false_rejects(name, recipe, config, k, target, budget, bases))
    return figures


if __name__ == "__main__":
    chosen = sys.argv[1:] or list(JOBS)
    results = run(names=chosen)
    for name in chosen:
        print(f"\n{name}: false rejects: {results[f'{name}: false rejects']:.0f} of {results[f'{name}: audited segments']:.0f}")
    print_figures("honest-but-different executors (threads, ulp, float64), every segment audited", results)

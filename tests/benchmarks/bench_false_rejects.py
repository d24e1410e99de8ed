"""False rejects: honest-but-different executors audited segment by segment, k = 25 (target: 0 of ≥ 300 per recipe).

Per recipe, the class is calibrated the way the tests calibrate it (tiny-lm: ``calibrate`` over seeds
0, 1, 2 from a warm-up; DQN: ``calibrate_states`` on two bases of an honest run, as
tests/test_audit_rl.py), which gives τ(25), the field tolerances, the margin tolerance and the
update floor. Then, for other seeds, a whole run is trained by each honest variant of
``verify/variants.py`` (threads, one ulp, float64), every segment by that variant from its own
previous state — early learning included (tiny-lm's warm-up, DQN's segments before and just after
``learning_starts``) — committed, and every segment of it audited with ``run_audit``. Printed per
recipe: rejections of N audited segments, the largest r/τ, and the largest r/tolerance over the
state's ``tolerance``/``close`` groups.

Left out, and counted apart: the "ulp" variant on a segment whose re-execution updates nothing (DQN
before ``learning_starts``). That variant nudges S_i's weights by one ulp before running, so it
commits weights that differ from S_i where no step touched them, and the audit rejects it (r = ∞,
docs/audit.md: a segment without an update must leave the weights exactly as they were). Real
hardware cannot produce that: without arithmetic on the weights every executor leaves them
bit-identical; the threads and float64 variants, audited on those segments, show it.

Runs until each recipe has ``TARGET`` audited segments or its time budget (about 4 minutes) is
spent, whichever comes first; the count says which.

Run: python tests/benchmarks/bench_false_rejects.py   (about 8 minutes; smoke: a few seconds)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

K, TARGET, BUDGET_S = 25, 300, 240.0
JOBS = {
    # name: (recipe, config, calibration bases: "seeds" via calibrate(warmup), or steps of an honest run)
    "tiny-lm": ("tiny-lm", {"steps": 500, "d_model": 16, "heads": 2, "layers": 1, "seq_len": 16, "batch_size": 4,
                            "threads": 1, "warmup": 50}, {"warmup": 100}),
    "dqn": ("dqn", {"steps": 1000, "learning_starts": 200, "buffer_size": 2000, "batch_size": 64, "lr": 1e-3,
                    "hidden": 64}, {"base_steps": (500, 800)}),
}
SMOKE_JOBS = {
    "tiny-lm": ("tiny-lm", {"steps": 50, "d_model": 16, "heads": 2, "layers": 1, "seq_len": 16, "batch_size": 4,
                            "threads": 1, "warmup": 10}, {"warmup": 25}),
    "dqn": ("dqn", {"steps": 100, "learning_starts": 30, "buffer_size": 200, "batch_size": 16}, {"base_steps": (50,)}),
}


def calibrated(recipe, config: dict, how: dict, bases: int):
    from audit_support import train
    from trainmaster.verify.calibrate import calibrate, calibrate_states

    if "warmup" in how:
        return calibrate(recipe, config, ks=[K], seeds=range(bases), warmup=how["warmup"])
    run = train(recipe, config, 0, K)
    return calibrate_states(recipe, [run.states[step // K] for step in how["base_steps"]][:bases], ks=[K])


def false_rejects(name: str, recipe_name: str, config: dict, how: dict, target: int, budget_s: float, bases: int) -> dict[str, float]:
    from audit_support import commit, train, variant_segments
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.openings import LocalOpenings
    from trainmaster.verify.variants import HONEST_VARIANTS

    recipe = get_recipe(recipe_name)
    calibration = calibrated(recipe, config, how, bases)
    tau = calibration.tau(K)
    started = time.perf_counter()
    audited = rejected = unchanged = 0
    worst_r = worst_field = 0.0
    seed = 100
    while True:  # at least one seed, then until the target or the budget
        for variant in HONEST_VARIANTS:
            run = train(recipe, config, seed, K, variant_segments(recipe, K, variant))
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
                worst_r = max(worst_r, segment.r / tau)
                worst_field = max([worst_field, *(f.r / f.tolerance for f in segment.fields.values() if f.tolerance)])
        seed += 1
        if audited >= target or time.perf_counter() - started >= budget_s:
            break
    return {
        f"{name}: false rejects": float(rejected),
        f"{name}: audited segments": float(audited),
        f"{name}: ulp segments without an update, left out": float(unchanged),
        f"{name}: runs (seeds x 3 variants)": float(3 * (seed - 100)),
        f"{name}: largest r / tau": worst_r,
        f"{name}: largest field r / tolerance": worst_field,
        f"{name}: tau(25)": tau,
        f"{name}: seconds": time.perf_counter() - started,
    }


def run(smoke: bool = False) -> dict[str, float]:
    jobs, target, budget, bases = (SMOKE_JOBS, 1, 0.0, 1) if smoke else (JOBS, TARGET, BUDGET_S, 3)
    figures: dict[str, float] = {}
    for name, (recipe, config, how) in jobs.items():
        figures.update(false_rejects(name, recipe, config, how, target, budget, bases))
    return figures


if __name__ == "__main__":
    results = run()
    for name in JOBS:
        print(f"\n{name}: false rejects: {results[f'{name}: false rejects']:.0f} of {results[f'{name}: audited segments']:.0f}")
    print_figures(f"honest-but-different executors (threads, ulp, float64), k = {K}, every segment audited", results)

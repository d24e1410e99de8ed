"""Catch rate of a freeze-at-boundary-j cheat vs j, with q = 8 (the figure a buyer cares about).

The cheater trains honestly up to boundary j, then freezes training in S_j and commits states
consistent with it after that: every later segment honestly trained from the frozen state. Two
freezes, which the audit sees differently:

* **moments**: Adam's second moments in S_j × 1e12 (``audit_support.frozen``). Segment j − 1
  reveals it always (the whole S_j is compared with the re-execution: ``exp_avg_sq`` r ≈ 4e12).
  A later segment i ≥ j starts from a frozen S_i: the moment bound ``|m| ≤ C·√v`` does *not* fire
  (inflating v only lowers |m| / √v). The update-norm floor does, measured below, **only without
  weight decay** (Adam, or AdamW with weight_decay 0): the re-executed update per lr falls to ~5e-6
  against a floor of ~9e-3, so every later segment — and the always-drawn n − 1 — rejects. With
  AdamW's decoupled decay (tiny-lm's default, 0.01) the decay part alone moves the weights by
  ~0.1 per lr, over the floor, and every later segment passes: only segment j − 1 reveals it.
  The floor is 10⁻³ × the smallest honest update, so a milder freeze (v × 1e4: 100× slower
  training) passes it even without decay; then too only segment j − 1 reveals it.
* **eps = 1e30 recorded in the states** (``FREEZES[0]`` from j on): S_j's param groups differ from
  the spec's, and every later S_i fails to load into the spec's trainer (hyperparameters come from
  the spec), so segments j − 1 … n − 1 all reveal it, n − 1 always drawn: caught with probability 1.

1. Sampling (n = 400: T = 10,000, k = 25; q = 8): over many random secrets and roots, the share of
   real challenge draws (``verify.challenge.draw_segments``) holding a revealing segment; for
   "j − 1 only" and for "j − 1 … n − 1". The average is over the interior boundaries j = 2 … n − 1
   (a cheater avoiding the always-checked first and last segments): ≈ q / (n − 2).
2. Measured: tiny-lm (n = 12, k = 10, q = 3 so that sampling matters), calibrated; for a few j and
   each freeze, the run is committed and ``run_audit`` runs on the real draw for 20 random secrets;
   the share rejected is printed next to the sampling prediction for the same draws' distribution.
   Each run is also audited on every segment once, to check which segments reveal the cheat (the
   claims above; a mismatch is printed).

Run: python tests/benchmarks/bench_catch_rate.py   (about a minute; smoke: a few seconds)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402

N, Q, SECRETS = 400, 8, 2_000
JS = (1, 2, 10, 100, 200, 399)
REAL = {"steps": 120, "k": 10, "q": 3, "js": (1, 4, 8, 11), "secrets": 20, "cal_seeds": (0, 1, 2), "cases": 4}
SMOKE_REAL = {"steps": 40, "k": 10, "q": 1, "js": (2,), "secrets": 3, "cal_seeds": (0,), "cases": 1}


def draws(n: int, q: int, count: int) -> list[set[int]]:
    """``count`` real challenge draws, each for a random secret and a random root."""
    from trainmaster.verify.challenge import draw_segments

    return [set(draw_segments(os.urandom(32), os.urandom(32).hex(), n, q)) for _ in range(count)]


def hit_rate(drawn: list[set[int]], revealing: range) -> float:
    """Share of the draws holding at least one revealing segment."""
    return sum(not d.isdisjoint(revealing) for d in drawn) / len(drawn)


def sampling(n: int, q: int, secrets: int, js: tuple[int, ...]) -> dict[str, float]:
    drawn = draws(n, q, secrets)
    figures = {}
    for j in js:
        figures[f"n={n} q={q} j={j}: caught if segment j-1 only"] = hit_rate(drawn, range(j - 1, j))
        figures[f"n={n} q={q} j={j}: caught if segments j-1..n-1"] = hit_rate(drawn, range(j - 1, n))
    interior = [hit_rate(drawn, range(j - 1, j)) for j in range(2, n)]
    figures[f"n={n} q={q} average over interior j: segment j-1 only"] = sum(interior) / len(interior)
    figures[f"n={n} q={q} q/(n-2)"] = q / (n - 2)
    return figures


def measured(setup: dict) -> dict[str, float]:
    """Real audits of freeze-at-j runs on tiny-lm: rejected share vs the sampling prediction."""
    from audit_support import TINY_LM, Run, commit, frozen, train
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.calibrate import calibrate
    from trainmaster.verify.challenge import draw_segments
    from trainmaster.verify.openings import LocalOpenings
    from trainmaster.verify.variants import FREEZES, execute

    lm, k, q, seed = get_recipe("tiny-lm"), setup["k"], setup["q"], 7
    figures: dict[str, float] = {}
    cases = (  # (name, weight decay, freeze of S_j, variant of every later segment, revealing segments)
        ("moments x1e12, AdamW wd 0.01", 0.01, frozen, None, "j-1"),
        ("moments x1e12, wd 0", 0.0, frozen, None, "j-1..n-1"),
        ("moments x1e4, wd 0", 0.0, lambda s: frozen(s, 1e4), None, "j-1"),
        ("eps 1e30 in the states", 0.01, None, FREEZES[0], "j-1..n-1"),
    )
    for name, wd, freeze, variant, revealing in cases[: setup["cases"]]:
        config = {**TINY_LM, "steps": setup["steps"], "weight_decay": wd}
        calibration = calibrate(lm, config, ks=[k], seeds=setup["cal_seeds"], warmup=20)
        honest = train(lm, config, seed, k)
        n = honest.n
        prediction_draws = draws(n, q, SECRETS)
        for j in setup["js"]:
            run = Run(lm, seed, k, list(honest.states[:j]), list(honest.traces[: j - 1]))
            if freeze is not None:  # honest segment j − 1, frozen S_j, honest training from there
                run.traces.append(honest.traces[j - 1])
                run.states.append(freeze(honest.states[j]))
            for _ in range(len(run.traces), n):
                executed = execute(lm, run.states[-1], k, variant) if variant else execute(lm, run.states[-1], k)
                run.states.append(executed.state)
                run.traces.append(executed.trace)
            with tempfile.TemporaryDirectory() as tmp:
                commitment = commit(run, Path(tmp))
                rejected = 0
                for _ in range(setup["secrets"]):
                    report = run_audit(
                        commitment=commitment, openings=LocalOpenings(Path(tmp)),
                        segments=draw_segments(os.urandom(32), commitment.root, n, q),
                        recipe=lm, config=config, seed=seed, calibration=calibration,
                    )
                    rejected += not report.passed
                every = run_audit(
                    commitment=commitment, openings=LocalOpenings(Path(tmp)), segments=list(range(n)),
                    recipe=lm, config=config, seed=seed, calibration=calibration,
                )
            reveal = range(j - 1, j) if revealing == "j-1" else range(j - 1, n)
            found = [e.index for e in every.segments if not e.passed]
            key = f"tiny-lm n={n} q={q} {name}, j={j}"
            figures[f"{key}: every segment audited, the rejected ones are {revealing} (1 = yes)"] = float(found == list(reveal))
            if found != list(reveal):
                print(f"  {key}: segments rejected when all are audited: {found}")
            figures[f"{key}: measured catch rate ({setup['secrets']} audits)"] = rejected / setup["secrets"]
            figures[f"{key}: sampling prediction (segments {revealing})"] = hit_rate(prediction_draws, reveal)
    return figures


def run(smoke: bool = False) -> dict[str, float]:
    if smoke:
        return {**sampling(12, 2, 200, (1, 2, 11)), **measured(SMOKE_REAL)}
    return {**sampling(N, Q, SECRETS, JS), **measured(REAL)}


if __name__ == "__main__":
    results = run()
    print_figures(
        f"catch rate of a freeze at boundary j (n = {N}, q = {Q}, {SECRETS} real challenge draws)",
        {key: value for key, value in results.items() if key.startswith(f"n={N}")},
    )
    print_figures(
        "measured on tiny-lm: share of real audits rejected vs the draw's prediction",
        {key: value for key, value in results.items() if key.startswith("tiny-lm")},
    )

"""`trainmaster submit --wait` CLIs killed with kill -9 at seeded random times (0.1–4 s; 100 in the full run, 3 in
the smoke run), one after another on one home (tests/cli_chaos_support.py); then `ls` brings every recorded job to
its end. Prints the kills, the jobs recorded, accepted and failed, the duplicate charges and the reservations left
open: every recorded job must end accepted (a launch our own killed process did not finish is redone, never
blamed on the job).
Run: python tests/benchmarks/bench_cli_chaos.py [--kills N] [--seed S] [--scaled]
(--scaled: on a loaded machine, where a CLI takes longer than 4 s to record its job, the window is stretched by how
much longer one whole `submit --wait` takes there, so the kills still fall across a submit's whole life)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402
from cli_chaos_support import run_chaos  # noqa: E402


def run(smoke: bool = False, kills: int = 100, seed: int = 33, scaled: bool = False) -> dict[str, float]:
    kills = 3 if smoke else kills
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_chaos(Path(tmp) / "home", Path(tmp) / "code", kills=kills, seed=seed, scaled=scaled)
    for problem in outcome.problems:
        print(f"  PROBLEM: {problem}")
    figures = {
        "kills": float(outcome.kills),
        "recorded": float(len(outcome.jobs)),
        "accepted": float(outcome.accepted),
        "failed": float(sum(s == "failed" for s in outcome.jobs.values())),
        "duplicate_charges": float(outcome.duplicate_charges),
        "open_reservations": float(outcome.open_reservations),
        "window_low_s": outcome.window[0],
        "window_high_s": outcome.window[1],
        "wall_s": outcome.seconds,
    }
    print_figures("submit --wait under kill -9", figures,
                  {"accepted": "= recorded", "failed": "0", "duplicate_charges": "0", "open_reservations": "0"})
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--scaled", action="store_true",
                        help="stretch the 0.1-4 s window by how much longer a whole submit takes on this machine")
    args = parser.parse_args()
    run(kills=args.kills, seed=args.seed, scaled=args.scaled)

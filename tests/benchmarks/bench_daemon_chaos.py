"""The daemon killed with kill -9 at seeded random moments (100 in the full run, 3 in the smoke run) while a folder
trigger is fed new files (tests/chaos_support.py); prints kills, files fed, fires, jobs, duplicates or losses found
(0 when the daemon keeps its promises) and the wall time.
Run: python tests/benchmarks/bench_daemon_chaos.py [--kills N] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402
from chaos_support import run_chaos  # noqa: E402


def run(smoke: bool = False, kills: int = 100, seed: int = 19) -> dict[str, float]:
    kills = 3 if smoke else kills
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_chaos(Path(tmp) / "home", Path(tmp) / "code", kills=kills, seed=seed)
    for problem in outcome.problems:
        print(f"  PROBLEM: {problem}")
    figures = {
        "kills": float(outcome.kills),
        "files_fed": float(outcome.files),
        "fires": float(outcome.fires),
        "jobs": float(len(outcome.jobs)),
        "accepted": float(sum(s == "accepted" for s in outcome.jobs.values())),
        "duplicates_or_losses": float(len(outcome.problems)),
        "wall_s": outcome.seconds,
    }
    print_figures("daemon under kill -9", figures, {"duplicates_or_losses": "0"})
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--seed", type=int, default=19)
    args = parser.parse_args()
    run(kills=args.kills, seed=args.seed)

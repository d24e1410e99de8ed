"""#33 §2 under chaos: `submit --wait` CLIs killed with kill -9 at seeded random moments across a whole submit's life
(tests/cli_chaos_support.py; 100 kills in tests/benchmarks/bench_cli_chaos.py): every job a killed CLI recorded ends
accepted, charged once, its reservation settled; a launch a killed CLI did not finish is finished by a later one."""

from __future__ import annotations

import pytest

from cli_chaos_support import run_chaos

pytestmark = pytest.mark.slow


def test_killed_submits_lose_no_job_and_pay_nothing_twice(tmp_path):
    outcome = run_chaos(tmp_path / "home", tmp_path / "code", kills=6, seed=7, scaled=True)
    assert outcome.jobs, "no killed CLI recorded a job: the window missed every submit"
    assert outcome.problems == [], outcome.problems
    assert outcome.accepted == len(outcome.jobs) and outcome.duplicate_charges == 0 and outcome.open_reservations == 0

"""`status`, `cancel` and job references read by a person, through the real CLI (#16 §8): each transition
once, labelled job or attempt; a long reason once; the cost's basis shown; whole headers in 80 columns;
a cancelled attempt's end time; a cancel of an ended job says that nothing was stopped; an ambiguous
prefix lists what it matches, with `…` only when there are more."""

from __future__ import annotations

import json

from cli_run import tm

LOUD_FAILURE = """\
import sys
print("the loss exploded at step 7 because the learning rate was far too high for this model", flush=True)
sys.exit(3)
"""
SLEEPS = "import time\ntime.sleep(120)\n"


def _submit(spec, home, *extra) -> dict:
    out = tm("submit", str(spec), "--json", *extra, home=home)
    assert out.stdout, out.stderr
    return json.loads(out.stdout)


def test_status_shows_each_transition_once_a_long_reason_once_and_the_costs_basis(tm_home, job_factory):
    job = _submit(job_factory(LOUD_FAILURE, "estimated_hours: 0.001\n"), tm_home, "--wait")
    assert job["state"] == "failed"
    shown = tm("status", job["id"], home=tm_home).stdout
    assert shown.count("the loss exploded at step 7") == 1, shown
    rows = [line.split() for line in shown.splitlines()]
    ended = [row for row in rows if "running" in row and "→" in row and "failed" in row]
    assert sorted(row[2] for row in ended) == ["attempt", "job"], shown  # the attempt's end and the job's, told apart
    basis = [e["detail"]["basis"] for e in json.loads(tm("status", job["id"], "--json", home=tm_home).stdout)["events"]
             if e["kind"] == "cost"]
    assert basis and any("cost $" in line and basis[0] in line for line in shown.splitlines()), shown


def test_the_plan_keeps_whole_headers_in_80_columns(tm_home, job_factory):
    spec = job_factory("print('hi')\n", "estimated_hours: 0.001\n")
    for command in (("submit", str(spec), "--dry-run"), ("offers", str(spec))):
        shown = tm(*command, home=tm_home, extra_env={"COLUMNS": "80"}).stdout
        header = next(line for line in shown.splitlines() if "backend" in line)
        assert "…" not in header and "expected" in header and len(header) <= 80, shown
        assert "✔ the chosen offer" in shown  # why each other lost: below its row (#33 §6)


def test_a_cancelled_attempt_ends_and_a_second_cancel_says_nothing_was_stopped(tm_home, job_factory):
    job = _submit(job_factory(SLEEPS, "estimated_hours: 0.001\n"), tm_home)
    first = tm("cancel", job["id"], home=tm_home)
    assert first.returncode == 0 and "nothing was stopped" not in first.stdout, first.stdout
    attempts = json.loads(tm("status", job["id"], "--json", home=tm_home).stdout)["attempts"]
    assert attempts and all(a["state"] == "cancelled" and a["ended_at"] for a in attempts), attempts
    again = tm("cancel", job["id"], home=tm_home)
    assert "nothing was stopped: the job had already ended (cancelled)" in again.stdout, again.stdout
    assert json.loads(tm("cancel", job["id"], "--json", home=tm_home).stdout)["already_ended"] is True


def test_an_ambiguous_prefix_lists_its_matches_without_a_dangling_ellipsis(tm_home, job_factory):
    ids = sorted(_submit(job_factory("print('hi')\n", "estimated_hours: 0.001\n"), tm_home, "--wait")["id"]
                 for _ in range(2))
    shown = tm("status", "t-", home=tm_home)
    assert shown.returncode != 0 and f"matches several jobs: {ids[0]}, {ids[1]}; give more" in shown.stderr, shown.stderr
    assert "…" not in shown.stderr


def test_more_matches_than_shown_are_marked():
    from trainmaster.broker.store import SHOWN, several_jobs

    ids = [f"t-{i}" for i in range(SHOWN + 1)]
    assert several_jobs("t-", ids).endswith(f"t-{SHOWN - 1}, …; give more of the id")
    assert "…" not in several_jobs("t-", ids[:SHOWN])

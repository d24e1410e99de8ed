"""Budgets wait instead of failing when only reservations stand in the way (a real daemon, its API, local jobs):
five concurrent submits under a cap that holds two runs' estimates all run, those beyond the first ones wait
`queued` with the reason and start as reservations settle; a job fails only when the spend itself leaves no room."""

from __future__ import annotations

import json
import threading

from cli_run import tm
from daemon_support import call, kill, start, token_of, wait_for

from trainmaster.broker import paths

JOB = ("import os, pathlib, time\ntime.sleep(2)\n"
       "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")
LIMITS = "limits:\n  max_hours: 1\n"  # estimated at 1 h of this machine's power: $0.018


def _policy(tmp_path, cap: str):
    policy = tmp_path / "capped.yaml"
    policy.write_text("name: capped\ndefault:\n  primary: local\nbudgets:\n  - name: team\n    period: total\n"
                      f"    cap: {cap}\n")
    return policy


def test_concurrent_submits_under_a_cap_wait_for_reservations_instead_of_failing(tm_home, tmp_path, job_factory):
    policy = _policy(tmp_path, "0.04")  # two reservations of $0.018 fit, a third does not
    daemon = start(tm_home)
    token, address = token_of(tm_home), daemon["address"]
    try:
        specs = [job_factory(JOB, LIMITS) for _ in range(5)]
        answers: list = [None] * 5

        def submit(i: int) -> None:
            answers[i] = call(address, "POST", "/v1/jobs", token, {"spec": str(specs[i]), "policy": str(policy)},
                              timeout=120)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [status for status, _ in answers] == [201] * 5, answers
        waited = wait_for(lambda: [j for j in call(address, "GET", "/v1/jobs?all=1", token)[1]
                                   if j["state"] == "queued" and (j["reason"] or "").startswith("waiting for budget")],
                          60, "a job waiting for its budget")
        assert "budget 'team'" in waited[0]["reason"] and "it starts when they settle" in waited[0]["reason"]
        assert waited[0]["queue_position"] is None  # it holds no place in the machine's queue
        jobs = wait_for(lambda: (js := call(address, "GET", "/v1/jobs?all=1", token)[1]) and
                        all(j["state"] in ("accepted", "failed") for j in js) and js, 240, "every job to end")
        assert [j["state"] for j in jobs] == ["accepted"] * 5, [(j["id"], j["state"], j["reason"]) for j in jobs]
        assert all(j["reason"] is None for j in jobs)  # the wait's reason is gone once it ran
        events = call(address, "GET", f"/v1/jobs/{waited[0]['id']}", token)[1]["events"]
        queued = [e for e in events if e["to"] == "queued"]
        assert queued and queued[0]["detail"]["waiting"].startswith("waiting for budget")
        assert not any("refused by budget" in json.dumps(e) for e in events)
    finally:
        kill(daemon["pid"])


def test_a_job_fails_when_the_spend_itself_leaves_no_room(tm_home, tmp_path, job_factory):
    from trainmaster.wallet.ledger import Ledger

    policy = _policy(tmp_path, "0.04")
    with Ledger(paths.state_db()) as ledger:  # $0.03 already spent this period by an earlier run
        ledger.reserve("reserve:old", job_id="old", backend="local", workload="development", micro_usd=30_000)
        ledger.charge("charge:old", reservation_key="reserve:old", micro_usd=30_000)
    daemon = start(tm_home)
    try:
        status, job = call(daemon["address"], "POST", "/v1/jobs", token_of(tm_home),
                           {"spec": str(job_factory(JOB, LIMITS)), "policy": str(policy)})
        assert status == 201 and job["state"] == "failed", job
        assert job["reason"].startswith("refused by budget: budget 'team'") and "spent $0.03" in job["reason"]
    finally:
        kill(daemon["pid"])


def test_the_cli_without_a_daemon_waits_too(tm_home, tmp_path, job_factory):
    from trainmaster.wallet.ledger import Ledger

    policy = _policy(tmp_path, "0.03")
    with Ledger(paths.state_db()) as ledger:  # another run holds $0.018 of the $0.03 (still running, say)
        ledger.reserve("reserve:other", job_id="other", backend="local", workload="development", micro_usd=18_000)
    out = tm("submit", str(job_factory(JOB, LIMITS)), "--policy", str(policy), "--json", home=tm_home)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "queued" and job["reason"].startswith("waiting for budget: budget 'team'")
    with Ledger(paths.state_db()) as ledger:
        ledger.release("release:other", reservation_key="reserve:other")  # it settled
    done = wait_for(lambda: (s := json.loads(tm("status", job["id"], "--json", home=tm_home).stdout))["state"]
                    in ("accepted", "failed") and s, 120, "the job to run")
    assert done["state"] == "accepted", done

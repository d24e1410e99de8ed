"""Cheating miners as real processes (tests/cheating_miners), caught through the real CLI: `trainmaster submit
JOB --wait` with backends.yaml listing the cheater (the cheapest miner where an honest one is listed too).

Each cheat that runs training runs it for real, altered (skipping half the segments, freezing through Adam's
state, returning another job's run); the others sign with another hotkey, go silent when challenged, or
serve bytes other than the sha256 they announced; one starts from a W0 of its own choosing. Each is rejected with its reason in `status --json`,
unpaid (no payment row, `spend` shows nothing paid to it), banned (`executors ls --json`: hotkey and
coldkey), and left out of later jobs with the ban as the reason. A miner that replays the broker's signed
dispatch is refused by the miners it replays to and gains nothing; a download cut halfway resumes; a miner
that vanishes after committing is lost (no ban: nothing proves a fault) and the job goes to another miner.
The tiny job (tests/tiny_lm_job.py `short_job`: 40 steps) has 4 segments and the spec's q = 8 challenges them
all, so every cheat is sampled; the one refused while its outputs download (bad_hash) is given a job that trains
nothing (tests/cheater_support.py `MADE_JOB`), since it is refused before anything looks at what its run made.
"""

from __future__ import annotations

import json

import pytest

from cheater_support import (BANNED, MADE_JOB, _caught, _cheater, _coldkey, _setup, honest,  # noqa: F401
                             started, wallets)
from cheating_miners.miners import CUT_LOG, REPLAY_TO_ENV, REPLAYS
from miner_support import shown as _shown, tm as _tm
from state_rows import state_rows
from tiny_lm_job import short_job

pytestmark = pytest.mark.slow

CAUGHT = {
    "skip_half": "the replay audit failed: segment 2: r = 1 exceeds τ = 0.01: the committed S_3 is not what",
    "freeze": "the replay audit failed: segment 1: S_2's optimizer/state/*/exp_avg_sq is not what these k steps "
              "produce",
    "wrong_key": "the commitment signature is not valid for the dispatched hotkey",
    "silent": "did not open the challenged segments",
    "bad_hash": "differs from the announced",
    "w0": "the replay audit failed: segment 0: S_0's weights are not the W0 the spec's recipe and seed produce with "
          "the CPU kernel set ",
}
"""What the cheater's attempt is rejected for (its reason in `status --json`), by kind."""
DEADLINE_S = {"silent": 5}
"""The policy's challenge_deadline_s: short where the miner goes silent (its attempt waits that long), generous
elsewhere, so an honest answer on a loaded machine is never late."""
JOBS = {"bad_hash": MADE_JOB}
"""The job by kind: the tiny LM's short run (4 segments) unless the cheat is refused in its outputs' download, before
anything verifies what they are (tests/cheater_support.py `MADE_JOB`: one output, no training)."""


def _jobs(miner) -> set[str]:
    """The attempts a miner has taken on (a folder each in its home's jobs/)."""
    jobs = miner.home / "jobs"
    return {p.name for p in jobs.iterdir()} if jobs.is_dir() else set()


def _submit(spec, policy) -> dict:
    done = _tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    shown = _shown(done)
    return _shown(_tm("status", shown["id"], "--json"))


def test_skipping_half_the_segments_is_rejected_unpaid_banned_and_the_job_goes_to_an_honest_miner(
        tmp_path, tm_home, wallets, started, honest):
    cheater = _cheater("skip_half", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [cheater, honest], job_yaml=short_job())
    shown = _submit(spec, policy)
    assert shown["state"] == "accepted", shown
    first, second = shown["attempts"]
    assert (cheater.home / "jobs" / first["id"]).is_dir() and (honest.home / "jobs" / second["id"]).is_dir()
    assert CAUGHT["skip_half"] in _caught(tm_home, shown, cheater, spec, policy)["reason"]
    payments = state_rows(tm_home, "SELECT payee, attempt_id FROM payments WHERE job_id = ?", shown["id"])
    assert [tuple(p) for p in payments] == [(_coldkey(honest), second["id"])]  # paid to its owner
    charges = state_rows(tm_home, "SELECT rao FROM ledger_entries WHERE job_id = ? AND kind = 'charge'", shown["id"])
    assert [c["rao"] for c in charges] == [p["rao"] for p in state_rows(tm_home, "SELECT rao FROM payments")]


@pytest.mark.parametrize("kind", ["freeze", "wrong_key", "silent", "bad_hash", "w0"])
def test_a_cheater_is_rejected_unpaid_and_banned(kind, tmp_path, tm_home, wallets, started):
    cheater = _cheater(kind, tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [cheater], DEADLINE_S.get(kind, 600), job_yaml=JOBS.get(kind, short_job()))
    shown = _submit(spec, policy)
    assert CAUGHT[kind] in _caught(tm_home, shown, cheater, spec, policy)["reason"], shown
    assert shown["state"] == "failed" and BANNED in shown["reason"], shown  # no other miner to go to
    assert not state_rows(tm_home, "SELECT * FROM payments")
    [spent] = json.loads(_tm("spend", "--json").stdout)
    assert (spent["group"], spent["rao"], spent["charges"]) == ("total", 0, 0)  # nothing paid to anyone


def test_a_download_cut_halfway_resumes_and_the_honest_work_is_paid_once(tmp_path, tm_home, wallets, started):
    cutter = _cheater("cut", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [cutter], job_yaml=short_job())
    shown = _submit(spec, policy)
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    assert "model.safetensors" in {f["path"] for f in attempt["outputs"]}
    cut = (cutter.home / CUT_LOG).read_text().splitlines()
    assert "model.safetensors" in cut  # its first download was cut halfway
    payments = state_rows(tm_home, "SELECT payee, attempt_id FROM payments WHERE job_id = ?", shown["id"])
    assert [tuple(p) for p in payments] == [(_coldkey(cutter), attempt["id"])]
    assert not _shown(_tm("executors", "ls", "--json"))["bans"]


def test_a_replayed_dispatch_is_refused_by_every_miner_and_gains_nothing(tmp_path, tm_home, wallets, started,
                                                                         honest, monkeypatch):
    monkeypatch.setenv(REPLAY_TO_ENV, honest.url)
    replayer = _cheater("replay", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [replayer], job_yaml=short_job())
    honest_jobs = _jobs(honest)  # what the file's honest miner ran for other tests
    shown = _submit(spec, policy)
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    replays = [json.loads(line) for line in (replayer.home / REPLAYS).read_text().splitlines()]
    assert [(r["to"], r["status"], r["error"]) for r in replays] == [
        (replayer.url, 401, "ReplayedRequest"),  # its own nonce store has seen it
        (honest.url, 401, "WrongReceiver")]  # signed for the replayer only
    assert _jobs(honest) == honest_jobs  # it ran nothing for the replay
    payments = state_rows(tm_home, "SELECT payee, attempt_id FROM payments")
    assert [tuple(p) for p in payments] == [(_coldkey(replayer), attempt["id"])]  # once, for its one attempt
    assert len(state_rows(tm_home, "SELECT * FROM ledger_entries WHERE kind = 'charge'")) == 1


def test_returning_another_jobs_run_is_rejected_unpaid_and_banned_after_an_honest_first_job(
        tmp_path, tm_home, wallets, started):
    reuser = _cheater("reuse", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [reuser], job_yaml=short_job())
    first = _submit(spec, policy)
    assert first["state"] == "accepted", first  # its first run is its own, honest
    second = _submit(spec, policy)
    [attempt] = second["attempts"]
    assert (reuser.home / "jobs" / attempt["id"] / "outputs" / "commitment.json").read_bytes() == \
        (reuser.home / "stash" / "outputs" / "commitment.json").read_bytes()  # the first job's run, sent again
    reason = _caught(tm_home, second, reuser, spec, policy)["reason"]
    assert f"the commitment is for job '{first['id']}', not '{second['id']}'" in reason, second
    assert second["state"] == "failed" and BANNED in second["reason"], second
    payments = state_rows(tm_home, "SELECT attempt_id FROM payments")
    assert [p["attempt_id"] for p in payments] == [first["attempts"][0]["id"]]  # the honest first job only
    charged = state_rows(tm_home, "SELECT job_id FROM ledger_entries WHERE kind = 'charge'")
    assert [c["job_id"] for c in charged] == [first["id"]]


def test_a_miner_that_vanishes_after_committing_is_lost_unpaid_unbanned_and_the_job_goes_elsewhere(
        tmp_path, tm_home, wallets, started, honest):
    vanisher = _cheater("vanish", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [vanisher, honest], unreachable_s=3, job_yaml=short_job())
    shown = _submit(spec, policy)
    assert shown["state"] == "accepted", shown
    first, second = shown["attempts"]
    assert (vanisher.home / "jobs" / first["id"] / "outputs" / "commitment.json").is_file()  # it had committed
    assert vanisher.proc.poll() is not None  # and is gone
    assert first["state"] == "failed" and first["reason"].startswith("lost: unreachable"), shown
    assert (honest.home / "jobs" / second["id"]).is_dir() and second["state"] == "accepted"
    payments = state_rows(tm_home, "SELECT payee, attempt_id FROM payments")
    assert [tuple(p) for p in payments] == [(_coldkey(honest), second["id"])]  # paid to its owner
    assert not _shown(_tm("executors", "ls", "--json"))["bans"]  # a loss is nobody's proven fault

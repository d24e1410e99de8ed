"""#33 §9: what a miner sends is bounded in size and time, and nothing it sends paints over the user's terminal.

Cheating miners as real processes (tests/cheating_miners), through the real CLI (`submit --wait`, `status`, `ls`,
`logs`): an output announced at 10 TB is refused before a byte is written — the miner's fault over the spec's
`outputs.max_gb` (rejected, banned, unpaid, shown at $0), our environment without one (the attempt waits, saying
what to fix, nothing kept, nobody blamed); outputs trickled a byte a second miss their deadline; an answer that
completes with fewer bytes than announced, or a resume shorter than its Content-Range, is the miner's statement;
a miner mute after its dispatch is lost within `unreachable_after_s`, not minutes per status call; one that says
it runs past the job's max_hours is ended by the broker's own clock and banned; a log's terminal escapes are
printed as visible text, and a miner's claimed start is not shown as the time it started. The job is the short
tiny LM (tests/tiny_lm_job.py `short_job`): what is proved here is about what comes back, not the training's length;
the miners whose cheat is in their outputs' download, or who go mute or say they run forever, are given a job that
trains nothing (MADE_JOB, IDLE_JOB): the broker refuses them before it looks at what the run made (a download is
checked against the size and sha256 its miner announced, before any verification), so a run of the tiny LM (its
training and its self-check, ~10 s of CPU each) would prove nothing more there.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest

from cheater_support import (BANNED, IDLE_JOB, MADE_JOB, _caught, _cheater, _coldkey, _setup,  # noqa: F401
                             started, wallets)
from cheating_miners.miners import SHORT_LOG
from miner_support import shown as _shown, tm as _tm
from state_rows import state_rows
from tiny_lm_job import short_job

pytestmark = pytest.mark.slow


def _configure(tm_home, **bittensor) -> None:
    """Add settings to backends.yaml's bittensor section (after _setup wrote it)."""
    path = tm_home / "config" / "backends.yaml"
    text = path.read_text()
    extra = "".join(f"  {k}: {v}\n" for k, v in bittensor.items())
    path.write_text(text.replace("bittensor:\n", "bittensor:\n" + extra, 1))


def _spec_extra(spec, extra: str) -> None:
    spec.write_text(spec.read_text() + extra)


def _submitted(spec, policy) -> tuple:
    done = _tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done, _shown(_tm("status", _shown(done)["id"], "--json")) if "{" in done.stdout else None


def _leftovers(tm_home, job_id: str) -> list[str]:
    """Files under the job's folder other than its bundle, spec, logs and verdicts (partial downloads above all)."""
    root = tm_home / "jobs" / job_id
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                  and (".partial" in str(p) or "outputs" in p.parts or p.stat().st_size > 2**20))


def _unpaid_shown_free(tm_home, shown: dict) -> None:
    assert shown["cost_micro_usd"] == 0 and all(a["cost_micro_usd"] == 0 for a in shown["attempts"]), shown
    listed = _tm("ls", "--all").stdout
    assert shown["id"] in listed and "$0.00" in listed and "$200" not in listed, listed


def test_an_output_announced_over_max_gb_is_refused_before_a_byte_and_the_miner_banned(
        tmp_path, tm_home, wallets, started):
    huge = _cheater("huge", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [huge], job_yaml=MADE_JOB)
    _spec_extra(spec, "outputs:\n  max_gb: 1\n")
    done, shown = _submitted(spec, policy)
    attempt = _caught(tm_home, shown, huge, spec, policy)
    assert "announced 10.0 TB of outputs, over the spec's outputs.max_gb (1.0 GB)" in attempt["reason"], attempt
    assert shown["state"] == "failed" and BANNED in shown["reason"]
    assert _leftovers(tm_home, shown["id"]) == []  # not a byte of it was written
    _unpaid_shown_free(tm_home, shown)


def test_an_output_larger_than_the_free_disk_waits_on_us_keeps_nothing_and_blames_nobody(
        tmp_path, tm_home, wallets, started):
    huge = _cheater("huge", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [huge], job_yaml=MADE_JOB)
    done, _ = _submitted(spec, policy)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "free some space, or set the job's outputs.max_gb" in done.stderr, done.stderr
    [job] = json.loads(_tm("ls", "--json").stdout)
    status = _tm("status", job["id"], "--json")  # shown as recorded, with what to fix (exit 2: our environment)
    assert status.returncode == 2 and "Traceback" not in status.stderr, status.stderr
    assert "free some space" in status.stderr
    shown = json.loads(status.stdout)
    assert shown["state"] == "returned" and [a["state"] for a in shown["attempts"]] == ["returned"]
    errors = [e["detail"] for e in shown["events"] if e["kind"] == "error"]
    assert errors and errors[-1]["cause"] == "our_environment", errors
    assert _leftovers(tm_home, job["id"]) == []
    assert not _shown(_tm("executors", "ls", "--json"))["bans"]


def test_a_trickling_miner_is_rejected_at_its_download_deadline(tmp_path, tm_home, wallets, started):
    trickle = _cheater("trickle", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [trickle], job_yaml=MADE_JOB)
    _configure(tm_home, download_grace_s=5)
    began = time.monotonic()
    done, shown = _submitted(spec, policy)
    attempt = _caught(tm_home, shown, trickle, spec, policy)
    assert "of outputs it announced within the 5 s + 256 kB/s the broker allows" in attempt["reason"], attempt
    assert time.monotonic() - began < 240
    assert _leftovers(tm_home, shown["id"]) == []
    _unpaid_shown_free(tm_home, shown)


def test_an_answer_complete_but_short_is_the_miners_statement_not_a_network_fault(tmp_path, tm_home, wallets, started):
    short = _cheater("short", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [short], job_yaml=MADE_JOB)
    done, shown = _submitted(spec, policy)
    attempt = _caught(tm_home, shown, short, spec, policy)
    assert "its answer announces" in attempt["reason"] or "its answer ended whole after" in attempt["reason"], attempt
    asked = (short.home / SHORT_LOG).read_text().splitlines()
    assert len(asked) == 1, asked  # refused at the first short answer, never asked again
    _unpaid_shown_free(tm_home, shown)


def test_a_resume_shorter_than_its_content_range_is_refused(tmp_path, tm_home, wallets, started):
    cheat = _cheater("short_range", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [cheat], job_yaml=MADE_JOB)
    done, shown = _submitted(spec, policy)
    attempt = _caught(tm_home, shown, cheat, spec, policy)
    assert "its answer announces" in attempt["reason"] and "bytes for the" in attempt["reason"], attempt
    assert _leftovers(tm_home, shown["id"]) == []


def test_a_miner_mute_after_its_dispatch_is_lost_in_bounded_time_and_not_banned(tmp_path, tm_home, wallets, started):
    mute = _cheater("mute", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [mute], unreachable_s=5, job_yaml=IDLE_JOB)
    _configure(tm_home, status_timeout_s=2)
    began = time.monotonic()
    done, shown = _submitted(spec, policy)
    took = time.monotonic() - began
    assert took < 150, took  # was: minutes per status call, 4 tries of 60 s each
    [attempt] = shown["attempts"]
    assert shown["state"] == "failed" and attempt["state"] == "failed", shown
    assert attempt["reason"].startswith("lost: unreachable"), attempt
    assert not _shown(_tm("executors", "ls", "--json"))["bans"]  # silence proves no fault
    _unpaid_shown_free(tm_home, shown)
    began = time.monotonic()
    logs = _tm("logs", shown["id"])  # a read of a log its miner never sends: one bounded wait, with a message
    assert time.monotonic() - began < 20 and logs.returncode != 0, (time.monotonic() - began, logs.returncode)
    assert "is unreachable" in logs.stderr and "Traceback" not in logs.stderr, logs.stderr[-2000:]


def test_a_miner_that_says_it_runs_past_the_jobs_max_hours_is_ended_by_the_brokers_clock_and_banned(
        tmp_path, tm_home, wallets, started):
    overrun = _cheater("overrun", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [overrun], job_yaml=IDLE_JOB)
    _configure(tm_home, overrun_grace_s=5)  # (60 s by default)
    _spec_extra(spec, "limits:\n  max_hours: 0.001\n")  # 3.6 s; the broker ends it 3.6 × 1.1 + 5 s after dispatch
    began = time.monotonic()
    done, shown = _submitted(spec, policy)
    assert time.monotonic() - began < 50  # the setting's grace, not the default's 60 s
    attempt = _caught(tm_home, shown, overrun, spec, policy)
    assert "past the job's limits.max_hours (0.001 h)" in attempt["reason"], attempt
    assert "still running, past the time it was paid for" in attempt["reason"]
    _unpaid_shown_free(tm_home, shown)


def test_a_miners_terminal_escapes_are_shown_as_text_and_its_claimed_start_is_not_shown_as_fact(
        tmp_path, tm_home, wallets, started):
    painter = _cheater("escapes", tmp_path, wallets, started)
    spec, policy = _setup(tmp_path, tm_home, [painter], job_yaml=short_job())
    done, shown = _submitted(spec, policy)
    assert shown["state"] == "accepted", shown
    logs = _tm("logs", shown["id"])
    assert logs.returncode == 0
    assert "\x1b" not in logs.stdout and "\x07" not in logs.stdout and "\r" not in logs.stdout
    assert "\\x1b]0;PWNED\\x07\\x1b[2J\\x1b[Hverdict: accepted\\x0d\\x1b[31mpaid" in logs.stdout, logs.stdout[:500]
    [attempt] = shown["attempts"]
    claimed = attempt["executor_claimed"]["started_at"]
    assert abs(attempt["started_at"] - time.time()) < 600 and time.time() - claimed > 99 * 3600, attempt
    text = _tm("status", shown["id"]).stdout
    hundred_hours_ago = dt.datetime.fromtimestamp(claimed).strftime("%Y-%m-%d %H:%M")
    assert hundred_hours_ago not in text, text
    payments = state_rows(tm_home, "SELECT payee FROM payments")
    assert [p["payee"] for p in payments] == [_coldkey(painter)]  # honest work otherwise: paid


def test_bittensor_offers_read_at_80_columns(tmp_path, tm_home, wallets, started):
    from pty_run import in_terminal
    from cheater_support import _honest

    miners = [_honest(tmp_path, wallets, started), _cheater("cut", tmp_path, wallets, started)]
    spec, policy = _setup(tmp_path, tm_home, miners)
    screen = in_terminal("offers", str(spec), "--policy", str(policy), home=tm_home)
    assert screen.code == 0, screen.text
    assert all(len(line) <= 80 for line in screen.lines if not line.startswith("note:")), screen.text
    header = next(line for line in screen.lines if "backend" in line and "instance" in line)
    assert all(h in header for h in ("region", "GPUs", "$/hour", "time", "expected")), header
    rows = [line for line in screen.lines if " bittensor " in line]
    assert len(rows) == 2 and all("…" in row and "subnet" in row for row in rows), screen.text  # hotkeys shortened
    for miner in miners:
        assert any(row.split()[2].startswith(miner.hotkey[:5]) and row.split()[2].endswith(miner.hotkey[-4:])
                   for row in rows), (miner.hotkey, rows)
    assert " 0.0 " not in screen.text and "$0.…" not in screen.text
    wide = in_terminal("offers", str(spec), "--policy", str(policy), "--wide", home=tm_home)
    assert all(m.hotkey in wide.text for m in miners)

"""The failure bugs of issue #15 §2, each through `trainmaster` itself, with the registry's backends
pointed at scripted ones (tests/scripted_backend.py): a wrong-hash fetch (the bytes streamed through
the broker's real transfer code under a false sha256), a backend that stays unreachable, and a
capacity failure reported with an exit code."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from typer.testing import CliRunner

import scripted_backend as scripted
from scripted_backend import Script
from trainmaster.backends.base import AttemptStatus, Cause, Phase, TransientBackendError
from trainmaster.backends.retry import ATTEMPTS
from trainmaster.broker import paths

ANNOUNCED = "0" * 64  # not the sha256 of the bytes sent
WRONG_HASH = f"result.txt: sha256 {hashlib.sha256(b'weights').hexdigest()} differs from the announced {ANNOUNCED}"


@pytest.fixture
def registered(monkeypatch):
    """local, aws and bittensor registered as scripted backends (each with a fresh script), retries quick."""
    from trainmaster.backends import registry

    for name, cls in (("local", scripted.ScriptedLocal), ("aws", scripted.ScriptedAws),
                      ("bittensor", scripted.ScriptedBittensor)):
        target = f"scripted_backend:{cls.__name__}"
        # a scripted stand-in makes its own offers: no catalog, so no cloud set-up is needed for it to be planned
        monkeypatch.setitem(registry.REGISTRY, name, dataclasses.replace(registry.REGISTRY[name], target=target,
                                                                          catalog=False))
        monkeypatch.setitem(registry.BACKENDS, name, target)
        monkeypatch.setattr(cls, "script", Script())
    monkeypatch.setattr("trainmaster.backends.retry.MAX_WAIT_S", 0.01)
    monkeypatch.setenv("TRAINMASTER_BACKGROUND_S", "0")  # no pass in a process of its own: it could not see them
    return scripted


def tm(*args: str) -> tuple[int, dict | str]:
    from trainmaster.broker.cli import app

    result = CliRunner().invoke(app, list(args))
    out = result.output
    return result.exit_code, json.loads(out[out.index("{"):]) if "--json" in args and "{" in out else out


def policy(tmp_path, primary: str, **extra) -> str:
    path = tmp_path / f"{primary}.yaml"
    lines = [f"  {k}: {v}" for k, v in extra.items()]
    path.write_text("\n".join(["name: p", "default:", f"  primary: {primary}", *lines]) + "\n")
    return str(path)


def ledger(job_id: str) -> list[str]:
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as led:
        return [e.kind for e in led.entries(job_id=job_id)]


def test_a_wrong_hash_fetch_from_an_untrusted_executor_is_rejected_banned_and_never_fetched_again(
        tm_home, job_factory, tmp_path, registered):
    registered.ScriptedBittensor.script.announce = ANNOUNCED
    # untrusted compute is offered only a job that commits to its states (broker/auditability.py); the scripted
    # executor never runs it, so a runtime recipe's entrypoint is enough
    spec = job_factory("print(1)\n", entrypoint="python -m trainmaster.jobs.recipes.dqn")
    code, shown = tm("submit", str(spec), "--policy", policy(tmp_path, "bittensor"), "--wait",
                     "--json")
    assert code == 1, shown
    [attempt] = shown["attempts"]
    assert attempt["state"] == "rejected" and WRONG_HASH in attempt["reason"], attempt
    assert shown["state"] == "failed" and "its executor is banned" in shown["reason"], shown["reason"]
    assert ledger(shown["id"]) == ["reserve", "release"]  # nothing paid
    code, listed = tm("executors", "ls", "--json")
    assert {(b["kind"], b["key"]) for b in listed["bans"]} == {("hotkey", scripted.HOTKEY), ("coldkey", scripted.COLDKEY)}
    for _ in range(2):  # before: left `returned` and fetched again on every refresh, forever
        assert tm("status", shown["id"], "--json")[0] == 1
    assert registered.ScriptedBittensor.script.calls.count("fetch") == 1


def test_a_wrong_hash_fetch_from_our_own_compute_fails_after_bounded_retries_with_the_reason(
        tm_home, job_factory, tmp_path, registered):
    registered.ScriptedLocal.script.announce = ANNOUNCED
    code, shown = tm("submit", str(job_factory("print(1)\n")), "--policy", policy(tmp_path, "local"), "--wait", "--json")
    assert code == 1, shown
    [attempt] = shown["attempts"]
    assert attempt["state"] == "failed" and WRONG_HASH in attempt["reason"], attempt
    assert shown["state"] == "failed" and WRONG_HASH in shown["reason"]
    assert ledger(shown["id"]) == ["reserve", "charge"]  # our own compute ran: its cost is charged
    assert tm("executors", "ls", "--json")[1]["bans"] == []
    tm("status", shown["id"], "--json")
    assert registered.ScriptedLocal.script.calls.count("fetch") == ATTEMPTS


def test_a_backend_that_stays_unreachable_ends_the_attempt_lost_and_the_job_falls_back(
        tm_home, job_factory, tmp_path, registered):
    registered.ScriptedLocal.script.status = TransientBackendError("connection refused")
    spec = str(job_factory("print(1)\n"))
    code, waiting = tm("submit", spec, "--policy", policy(tmp_path, "local", fallbacks="[aws]"), "--json")
    assert code == 0, waiting  # within the policy's unreachable_after_s (600 s): it keeps its state
    code, shown = tm("status", waiting["id"], "--json")
    assert [(a["backend"], a["state"]) for a in shown["attempts"]] == [("local", "dispatched")]
    assert [e["detail"]["message"] for e in shown["events"] if e["kind"] == "unreachable"] == [
        "asking local for the status: connection refused"]

    gone = policy(tmp_path, "local", fallbacks="[aws]", unreachable_after_s=0)
    code, shown = tm("submit", spec, "--policy", gone, "--wait", "--json")
    assert code == 0, shown
    first, second = shown["attempts"]
    assert (first["backend"], first["state"], second["backend"], second["state"]) == ("local", "failed", "aws", "accepted")
    assert first["reason"].startswith("lost: unreachable for") and "connection refused" in first["reason"]
    assert ledger(shown["id"]) == ["reserve", "charge", "reserve", "charge"]


def test_a_capacity_failure_reported_with_an_exit_code_falls_back(tm_home, job_factory, tmp_path, registered):
    registered.ScriptedLocal.script.status = AttemptStatus(phase=Phase.failed, cause=Cause.capacity, exit_code=3,
                                                           reason="no GPU left on the node", started_at=1, ended_at=2)
    code, shown = tm("submit", str(job_factory("print(1)\n")), "--policy", policy(tmp_path, "local", fallbacks="[aws]"),
                     "--wait", "--json")
    assert code == 0, shown  # before: the job failed on the exit code, with no fallback
    assert shown["state"] == "accepted"
    assert [(a["backend"], a["state"]) for a in shown["attempts"]] == [("local", "failed"), ("aws", "accepted")]
    assert shown["attempts"][0]["reason"] == "no GPU left on the node"


def test_a_log_read_from_a_backend_that_never_answers_ends_in_bounded_time_with_a_message(
        tm_home, job_factory, tmp_path, registered, monkeypatch):
    """`trainmaster logs` (a read) waits LOGS_TIMEOUT_S for the backend's log, then says so: no hang, no traceback."""
    import asyncio

    from trainmaster.broker.cli import local_jobs

    async def never(self, handle, offset=0):
        await asyncio.sleep(3600)

    registered.ScriptedLocal.script.status = scripted.RUNNING
    monkeypatch.setattr(registered.ScriptedLocal, "logs", never)
    monkeypatch.setattr(local_jobs, "LOGS_TIMEOUT_S", 0.5)
    code, shown = tm("submit", str(job_factory("print(1)\n")), "--policy", policy(tmp_path, "local"), "--json")
    assert code == 0 and shown["state"] in ("dispatched", "running"), shown
    code, said = tm("logs", shown["id"])
    assert code != 0 and f"the backend holding {shown['id']}'s log did not answer within 0 s" in said, said
    assert "Traceback" not in said

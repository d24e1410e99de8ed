"""Cancel is a requested state driven through each attempt's own end (issue #15 §5).

Every (job state, attempt state) pair a job can be cancelled in, on our own compute and on an untrusted
executor's, is cancelled with a crash injected before or after any one step (the request, the backend's
cancel, the cost, the charge or release, an attempt's or the job's move), then a fresh Broker picks it
up: the store's invariants hold at every point (an ended job has only ended attempts; every ended
attempt's reservation is settled) and, in the end, the job is cancelled with every reservation
settled exactly once. `trainmaster cancel` is tested for a returned and a verifying attempt."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from broker_support import SyncBroker, reconcile_pass, sync_broker
from scripted_backend import RUNNING, Script, Scripted, ScriptedExecutor
from trainmaster.backends.base import AttemptStatus, Cause, Phase, TransientBackendError
from trainmaster.broker import paths
from trainmaster.broker.store import Store
from trainmaster.wallet.ledger import Ledger

PAIRS = [
    ("submitted", None), ("planned", None), ("queued", None), ("planned", "failed"),
    ("dispatched", "dispatched-unstarted"), ("dispatched", "dispatched"), ("running", "running"),
    ("returned", "returned"), ("verifying", "verifying"), ("unverified", "unverified"),
]
STEPS = [  # (owner, attribute): what cancelling does, one step at a time
    ("trainmaster.broker.store.Store", "request_cancel"), ("scripted_backend.Scripted", "cancel"),
    ("trainmaster.broker.store.Store", "record_cost"), ("trainmaster.wallet.ledger.Ledger", "charge"),
    ("trainmaster.wallet.ledger.Ledger", "release"), ("trainmaster.broker.store.Store", "move_attempt"),
    ("trainmaster.broker.store.Store", "move_job"),
]


class Crash(Exception):
    """The process dies here."""


def _backends(trusted: bool, script: Script) -> dict:
    primary = Scripted(name="local", script=script) if trusted else ScriptedExecutor(script=script)
    return {primary.name: primary}


def _policy(tmp_path, trusted: bool) -> str:
    path = tmp_path / f"cancel-{trusted}.yaml"
    path.write_text(f"name: c\ndefault:\n  primary: {'local' if trusted else 'bittensor'}\n  retries: 1\n")
    return str(path)


def _job_without_attempt(broker, spec, policy: str, state: str) -> str:
    """A job recorded but not dispatched (a process died, or it waits in the queue), with a reservation
    a dispatch that died left behind."""
    from trainmaster.broker.planning.policy import load_policy
    from trainmaster.jobs.spec import load_spec

    loaded, store = load_spec(spec), broker.store
    job_id = f"t-{len(store.jobs(limit=10_000)):08x}"
    store.create_job(job_id=job_id, name="t", workload=loaded.spec.workload, project=None,
                     spec_json=loaded.spec.model_dump_json(), spec_path=str(spec), bundle_sha256="0" * 64,
                     policy="c", policy_json=load_policy(policy).model_dump_json())
    if state != "submitted":
        store.set_plan(job_id, "{}", detail={})
        broker.parts.of(store.job(job_id)).ledger.reserve(f"reserve:{job_id}.1.p1", job_id=job_id, backend="local",
                                                       workload=loaded.spec.workload, micro_usd=5_000)
    if state == "queued":
        store.move_job(job_id, "queued")
    return job_id


def _build(broker, script: Script, spec, policy: str, pair) -> str:
    """A job in the pair's states, as the broker itself records them."""
    job_state, attempt_state = pair
    if attempt_state is None:
        return _job_without_attempt(broker, spec, policy, job_state)
    script.submit = TransientBackendError("unreachable") if attempt_state == "dispatched-unstarted" else None
    script.status = {"dispatched": AttemptStatus(phase=Phase.pending),
                     "failed": AttemptStatus(phase=Phase.failed, cause=Cause.lost, started_at=1, ended_at=2)
                     }.get(attempt_state, RUNNING)
    job_id = broker.submit(spec, policy).id
    [attempt] = broker.store.attempts(job_id)
    for state in ("returned", "verifying", "unverified"):  # as a process that died after recording it leaves it
        if attempt_state in ("returned", "verifying", "unverified"):
            broker.store.move_attempt(attempt.id, state, job_target=state)
        if state == attempt_state:
            break
    script.status = RUNNING
    return job_id


def _settlements(store: Store, job_id: str) -> tuple[set[str], dict[str, int]]:
    with Ledger(store.db) as ledger:
        entries = ledger.entries(job_id=job_id)
    reserved = {e.key for e in entries if e.kind == "reserve"}
    settled: dict[str, int] = {}
    for e in entries:
        if e.kind != "reserve":
            settled[e.reservation_key] = settled.get(e.reservation_key, 0) + 1
    return reserved, settled


def _crashing(monkeypatch, at: int, after: bool) -> None:
    """Every step counted; the `at`-th raises Crash, before or after it did its work."""
    import importlib

    seen = [0]
    for owner, attribute in STEPS:
        module, _, cls_name = owner.rpartition(".")
        cls = getattr(importlib.import_module(module), cls_name)
        real = getattr(cls, attribute)

        def step(*args, _real=real, **kwargs):
            seen[0] += 1
            if seen[0] == at and not after:
                raise Crash
            result = _real(*args, **kwargs)
            if seen[0] == at and after:
                raise Crash
            return result

        if attribute == "cancel":
            async def step_async(*args, _real=real, **kwargs):
                seen[0] += 1
                if seen[0] == at and not after:
                    raise Crash
                result = await _real(*args, **kwargs)
                if seen[0] == at and after:
                    raise Crash
                return result

            monkeypatch.setattr(cls, attribute, step_async)
        else:
            monkeypatch.setattr(cls, attribute, step)


@pytest.mark.parametrize("trusted", [True, False], ids=["ours", "untrusted"])
@pytest.mark.parametrize("pair", PAIRS, ids=["/".join(str(s) for s in p) for p in PAIRS])
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(min_value=0, max_value=9), after=st.booleans())
def test_cancel_crash_restart_keeps_the_invariants(job_factory, tmp_path, pair, trusted, at, after):
    import tempfile

    with tempfile.TemporaryDirectory(dir=tmp_path) as home, pytest.MonkeyPatch.context() as env:
        env.setenv("TRAINMASTER_HOME", home)  # each example on a state of its own
        seen = _cancel_crash_restart(job_factory, tmp_path, pair, trusted, at, after)
    assert seen["violations_after_crash"] == []  # whatever step it died at
    assert seen["job"] == "cancelled" and seen["violations_after_restart"] == []
    assert set(seen["attempts"]) <= {"cancelled", "failed"}  # none of the pairs before dispatch has one
    assert bool(seen["attempts"]) == (pair[1] is not None)
    assert set(seen["settled"]) == seen["reserved"] and set(seen["settled"].values()) <= {1}  # each settled, once
    if pair[1] in ("dispatched", "running"):  # stopped at its backend before it ended
        assert seen["backend_cancelled"]


def _cancel_crash_restart(job_factory, tmp_path, pair, trusted: bool, at: int, after: bool) -> dict:
    """A job brought to `pair`, cancelled with a crash at the `at`-th step, then a restarted broker finishing it:
    what the test checks (the store's invariant violations after the crash and after the restart, the job's and
    its attempts' states, the reservations and how often each was settled, whether the backend was told)."""
    from trainmaster.broker.service import Broker

    script = Script()
    # untrusted compute is offered only a job that commits to its states (broker/auditability.py); the scripted
    # executor never runs it, so a runtime recipe's entrypoint is enough
    policy = _policy(tmp_path, trusted)
    spec = job_factory("print(1)\n", **({} if trusted else {"entrypoint": "python -m trainmaster.jobs.recipes.dqn"}))
    broker = SyncBroker(Broker(backends=_backends(trusted, script)))
    job_id = _build(broker, script, spec, policy, pair)
    assert broker.store.job(job_id).state == pair[0]
    with pytest.MonkeyPatch.context() as patched:
        _crashing(patched, at, after)
        try:
            broker.cancel(job_id)
        except Crash:
            pass
    violations_after_crash = broker.store.violations(job_id)
    broker.close()

    restarted = SyncBroker(Broker(backends=_backends(trusted, script)))
    job = restarted.store.job(job_id)
    if job.cancel_requested_at is None and job.state != "cancelled":
        restarted.cancel(job_id)  # died before the request was recorded: the user cancels again
    else:
        restarted.advance(job_id)  # any later command finishes the cancel
    reserved, settled = _settlements(restarted.store, job_id)
    seen = {"violations_after_crash": violations_after_crash, "job": restarted.store.job(job_id).state,
            "violations_after_restart": restarted.store.violations(job_id),
            "attempts": [a.state for a in restarted.store.attempts(job_id)], "reserved": reserved,
            "settled": settled, "backend_cancelled": "cancel" in script.calls}
    restarted.close()
    return seen


def test_the_store_refuses_to_end_a_job_with_an_unfinished_attempt(tm_home, job_factory, tmp_path):
    from trainmaster.broker.service import Broker
    from trainmaster.broker.store import InvariantBroken

    script = Script(status=RUNNING)
    broker = SyncBroker(Broker(backends=_backends(True, script)))
    job = broker.submit(job_factory("print(1)\n"), _policy(tmp_path, True))
    [attempt] = broker.store.attempts(job.id)
    with pytest.raises(InvariantBroken, match="attempt 1 is running"):
        broker.store.move_job(job.id, "cancelled")
    with pytest.raises(InvariantBroken, match="reservation .* is still held"):
        broker.store.move_attempt(attempt.id, "cancelled")  # its money never settled
    assert broker.store.job(job.id).state == "running" and broker.store.attempt(attempt.id).state == "running"
    broker.close()


def _exit_recorded(job_id: str) -> None:
    from local_attempt import wait_ended

    wait_ended(paths.attempt_dir(job_id, 1))


@pytest.mark.parametrize("state", ["returned", "verifying"])
def test_trainmaster_cancel_ends_a_returned_or_verifying_attempt_and_settles_its_money(
        tm_home, job_factory, monkeypatch, state):
    """A job stuck `returned` (its outputs cannot be fetched: our disk is full) or `verifying` (the checks
    crash) is cancelled. Before: `verifying` raised IllegalTransition (a traceback); `returned` ended the
    job but left the attempt `returned` and its reservation held forever."""
    from trainmaster.backends.base import LocalEnvironmentError
    from trainmaster.backends.local import LocalBackend
    from trainmaster.broker.cli import app
    from trainmaster.broker.stages import collect

    async def full_disk(self, handle, dest, progress=None):
        raise LocalEnvironmentError("no space left while writing the outputs")

    async def crashing_checks(*args, **kwargs):
        raise RuntimeError("the verifier crashed")

    if state == "returned":
        monkeypatch.setattr(LocalBackend, "fetch", full_disk)
    else:
        monkeypatch.setattr(collect, "verify", crashing_checks)
    broker = sync_broker()
    job = broker.submit(job_factory("print('done')\n"))
    _exit_recorded(job.id)
    asyncio.run(reconcile_pass(broker.inner))  # what any command does first: it gets as far as it can
    [attempt] = broker.store.attempts(job.id)
    assert (broker.store.job(job.id).state, attempt.state) == (state, state)
    result = CliRunner().invoke(app, ["cancel", job.id, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["state"] == "cancelled" and [a["state"] for a in shown["attempts"]] == ["cancelled"]
    reserved, settled = _settlements(broker.store, job.id)
    assert set(settled) == reserved == {attempt.reserve_key} and settled[attempt.reserve_key] == 1
    with Ledger(broker.store.db) as ledger:  # our own machine ran it: what it cost is charged
        assert [e.kind for e in ledger.entries(job_id=job.id)] == ["reserve", "charge"]
    assert broker.store.violations(job.id) == []
    again = CliRunner().invoke(app, ["cancel", job.id])  # cancelling again changes nothing
    assert again.exit_code == 0 and f"{job.id}: cancelled" in again.output
    broker.close()


def test_a_resumed_job_is_not_cancelled_again_by_its_old_request(tm_home, job_factory, tmp_path):
    from trainmaster.broker.service import Broker

    script = Script(status=RUNNING)
    broker = SyncBroker(Broker(backends=_backends(True, script)))
    job = broker.submit(job_factory("print(1)\n"), _policy(tmp_path, True))
    assert broker.cancel(job.id).state == "cancelled" and broker.store.job(job.id).cancel_requested_at is not None
    resumed = broker.resume(job.id)
    assert resumed.cancel_requested_at is None and resumed.state == "running"
    assert [a.state for a in broker.store.attempts(job.id)] == ["cancelled", "running"]
    broker.close()


def test_trainmaster_cancel_repairs_what_an_older_cancel_left(tm_home, job_factory, tmp_path, monkeypatch):
    """An older version's cancel ended a job whose attempt was `returned` and left that attempt, and its
    reservation, as they were: cancelling the job again ends the attempt and settles its money."""
    import dataclasses

    from trainmaster.backends import registry
    from trainmaster.broker.cli import app
    from scripted_backend import ScriptedLocal

    target = "scripted_backend:ScriptedLocal"
    monkeypatch.setitem(registry.REGISTRY, "local", dataclasses.replace(registry.REGISTRY["local"], target=target))
    monkeypatch.setitem(registry.BACKENDS, "local", target)
    monkeypatch.setattr(ScriptedLocal, "script", Script(status=RUNNING))
    broker = sync_broker()
    job = broker.submit(job_factory("print(1)\n"), _policy(tmp_path, True))
    [attempt] = broker.store.attempts(job.id)
    broker.store.move_attempt(attempt.id, "returned", job_target="returned")
    with broker.store.tx() as db:  # what the older cancel wrote
        db.execute("UPDATE jobs SET state = 'cancelled' WHERE id = ?", (job.id,))
    assert broker.store.violations(job.id) == [f"job {job.id} is cancelled but its attempt 1 is returned"]
    result = CliRunner().invoke(app, ["cancel", job.id, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert shown["state"] == "cancelled" and [a["state"] for a in shown["attempts"]] == ["cancelled"]
    assert broker.store.violations(job.id) == []
    reserved, settled = _settlements(broker.store, job.id)
    assert set(settled) == reserved and set(settled.values()) == {1}
    broker.close()

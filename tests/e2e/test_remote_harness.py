"""Every feature through the remote harness, from the real CLI: the executor is a separate process with its
own TRAINMASTER_HOME on 127.0.0.1 (tests/remote_executor), reached only through its protocol.

Submit, the live progress line, cancel, resume after `kill -9` of the executor, the outcome check with an
evaluator, the replay audit, acceptance and payment in rao. Resume is shown with the harness registered as
a trusted backend: the core resumes only from trusted or accepted states, so an untrusted executor's
crashed attempt is never resumed from (tests/e2e/test_untrusted_path.py holds that rule)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from background_support import polled
from remote_executor import protocol
from remote_executor.cli import TRUSTED_ENV
from remote_executor.client import RemoteExecutor, TrustedRemoteExecutor
from remote_executor.process import TESTS, ExecutorProcess
from trainmaster.backends.base import BackendError, ExecutorFault, Handle
from tiny_lm_job import EVALUATOR, JOB, SHORT_STEPS, TINY_LM, short_job
from untrusted_backend import RAO_PER_TAO, USD_PER_TAO_MICRO

pytestmark = pytest.mark.slow

UNTRUSTED = "name: untrusted\ndefault:\n  primary: bittensor\nverification:\n  tau: 0.01\n"
TRUSTED = "name: trusted-remote\ndefault:\n  primary: local\n"


@pytest.fixture
def executor(tmp_path, monkeypatch):
    """The executor process, and this test's environment pointed at it (the CLI runs in subprocesses)."""
    proc = ExecutorProcess(tmp_path / "executor").start()
    monkeypatch.setenv(protocol.URL_ENV, proc.url)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    yield proc
    proc.stop()


def _job(root: Path, steps: int | None = None) -> Path:
    """The tiny LM of `steps` steps in segments of 25; the short one (tests/tiny_lm_job.py `short_job`: 40 steps in 4
    segments of 10) by default, for tests whose proof is not about the training's length."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "job.yaml").write_text(short_job() if steps is None else JOB.format(entrypoint=TINY_LM.format(steps=steps)))
    (root / "evaluate.py").write_text(EVALUATOR)
    (root / "untrusted.yaml").write_text(UNTRUSTED)
    (root / "trusted.yaml").write_text(TRUSTED)
    return root / "job.yaml"


def _tm(*args: str, trusted: bool = False, check: bool = False) -> subprocess.CompletedProcess:
    """`trainmaster ARGS` in its own process, the harness registered (remote_executor/cli.py)."""
    env = {**os.environ, TRUSTED_ENV: "1" if trusted else "0"}
    done = subprocess.run([sys.executable, "-m", "remote_executor.cli", *args], capture_output=True, text=True,
                          env=env, timeout=280)
    assert not check or done.returncode == 0, done.stdout + done.stderr
    return done


def _shown(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout[done.stdout.index("{"):])


def _ledger_rows(job_id: str):
    from trainmaster.broker import paths
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as ledger:
        return [e for e in ledger.entries() if e.job_id == job_id]


def _handle(attempt_id: str) -> Handle:
    """The broker's handle of an attempt, as stored (what the client needs: the executor's attempt id)."""
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    store = Store(paths.state_db())
    try:
        return Handle.model_validate_json(store.attempt(attempt_id).handle_json)
    finally:
        store.close()


def _files_mentioning(root: Path, needle: str) -> list[Path]:
    """Files under `root` holding `needle`, but for the outputs the executor sent (its own words)."""
    return [p for p in root.rglob("*") if p.is_file() and "outputs" not in p.relative_to(root).parts
            and needle.encode() in p.read_bytes()]


def test_an_honest_remote_executor_is_audited_evaluated_accepted_and_paid_in_rao(tm_home, tmp_path, executor):
    spec = _job(tmp_path / "job")
    done = _tm("submit", str(spec), "--policy", str(spec.parent / "untrusted.yaml"), "--wait", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = _shown(done)
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    assert attempt["backend"] == "bittensor"
    verdict = json.loads((tm_home / "jobs" / shown["id"] / "verdict.json").read_text())
    assert verdict["checks"] == ["integrity", "safety", "replay", "outcome"]
    assert verdict["evidence"]["integrity"]["signature"].startswith("valid for ")
    assert verdict["evidence"]["replay"]["challenge"]["segments"] == [0, 1, 2, 3]  # opened over HTTP
    outcome = verdict["evidence"]["outcome"]  # the broker's own evaluator, from its own bundle extraction
    assert outcome["passed"] and outcome["metrics"]["finite"] == 1.0 and outcome["metrics"]["tensors"] > 0
    rows = _ledger_rows(shown["id"])
    assert [r.kind for r in rows] == ["reserve", "charge"]
    assert rows[1].rao > 0 and rows[1].rate_micro_usd_per_tao == USD_PER_TAO_MICRO
    assert rows[1].micro_usd == rows[1].rao * USD_PER_TAO_MICRO // RAO_PER_TAO
    # the two homes are disjoint, and nothing the broker keeps (the outputs aside) names a path of the executor's
    home, theirs = tm_home.resolve(), executor.home.resolve()
    assert not home.is_relative_to(theirs) and not theirs.is_relative_to(home)
    assert _files_mentioning(tm_home, str(theirs)) == []
    assert (theirs / "attempts" / attempt["id"] / "outputs" / "model.safetensors").is_file()  # it ran there
    assert not (tm_home / "jobs" / shown["id"] / "attempts" / "1" / "outputs").exists()  # and not here


def test_the_live_progress_line_shows_the_remote_runs_steps(tmp_path, executor):
    """`trainmaster submit --wait` on a terminal: the status line's step comes through the metrics capability."""
    from pty_follow import on_terminal

    spec = _job(tmp_path / "job")
    code, shown = on_terminal("submit", str(spec), "--policy", str(spec.parent / "untrusted.yaml"), "--wait",
                               home=tmp_path / "home", cli="remote_executor.cli")
    assert code == 0, shown
    assert f"accepted · step {SHORT_STEPS}/{SHORT_STEPS} · " in shown and " steps/s · elapsed " in shown, shown


def test_cancel_stops_the_remote_run(tm_home, tmp_path, executor):
    spec = _job(tmp_path / "job", steps=100_000)
    job = _shown(_tm("submit", str(spec), "--policy", str(spec.parent / "untrusted.yaml"), "--json", check=True))
    [attempt] = job["attempts"]
    client = RemoteExecutor(url=executor.url)
    while asyncio.run(client.metrics(_handle(attempt["id"]))).size == 0:  # training: steps are being written
        time.sleep(0.1)
    cancelled = _shown(_tm("cancel", job["id"], "--json", check=True))
    assert cancelled["state"] == "cancelled"
    assert [a["state"] for a in cancelled["attempts"]] == ["cancelled"]
    assert asyncio.run(client.status(_handle(attempt["id"]))).phase.value == "cancelled"  # the executor's own word
    import psutil

    left = [p for p in psutil.Process(executor.proc.pid).children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    assert left == []  # nothing of the run still runs (a supervisor the server never reaped is a zombie)


def test_after_kill_9_of_the_executor_resume_continues_from_its_last_checkpoint(tm_home, tmp_path, executor):
    """The harness registered as a trusted backend (`local`). The executor, its training run with it, is
    killed once the run has committed a few segments; started again on the same home and port, it reports
    the run lost; `trainmaster resume` starts a new attempt from the first one's last checkpoint (asked of
    the executor, passed back opaquely) and ends on the final hash of an uninterrupted run."""
    spec = _job(tmp_path / "job", steps=200)  # killed past step 50: 150 steps left to resume
    policy = str(spec.parent / "trusted.yaml")
    job = _shown(_tm("submit", str(spec), "--policy", policy, "--json", trusted=True, check=True))
    [first] = job["attempts"]
    client = TrustedRemoteExecutor(url=executor.url)
    deadline = time.monotonic() + 240  # a bound on a hang only: the loop ends once both hold
    # past step 50 by its metrics, and a complete segment on the executor's disk: the segments are written
    # behind the training steps, so on a loaded machine the metrics alone run ahead of them
    checkpoints = executor.home / "attempts" / first["id"] / "checkpoints"  # the test looks
    while not (_steps_past(client, _handle(first["id"]), 50) and _complete_segment(checkpoints)):
        assert time.monotonic() < deadline, "the run committed no segment"
        time.sleep(0.05)
    assert executor.kill9() >= 2  # the server and the run it started

    def read() -> subprocess.CompletedProcess:  # a user's read: it starts the background pass if none runs
        done = _tm("status", job["id"], "--json", trusted=True)
        assert "Traceback" not in done.stderr, done.stderr  # said, not crashed
        return done

    down = polled(read, lambda done: "unreachable" in done.stdout + done.stderr)
    assert "unreachable" in down.stdout + down.stderr, down.stdout + down.stderr  # recorded: it waits, bounded
    assert _shown(down)["state"] == "running"  # not failed at once: unreachable_after_s has not passed

    executor.start()  # the same home and port
    failed = _shown(polled(read, lambda done: _shown(done)["state"] != "running"))
    assert failed["state"] == "failed" and "died without finishing" in failed["attempts"][0]["reason"], failed
    ref = asyncio.run(client.last_checkpoint(_handle(first["id"])))
    assert ref is not None and ref.uri == f"attempt:{first['id']}"  # the executor's own words, not a path

    resumed = _tm("resume", job["id"], "--wait", trusted=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    shown = _shown(_tm("status", job["id"], "--json", trusted=True, check=True))
    assert shown["state"] == "accepted" and [a["state"] for a in shown["attempts"]] == ["failed", "accepted"]
    second = shown["attempts"][1]
    launch = json.loads((executor.home / "attempts" / second["id"] / "launch.json").read_text())  # the test looks
    assert launch["env"]["TRAINMASTER_RESUME_FROM"] == str(executor.home / "attempts" / first["id"] / "checkpoints")

    whole = _shown(_tm("submit", str(spec), "--policy", policy, "--wait", "--json", trusted=True, check=True))
    assert whole["state"] == "accepted" and len(whole["attempts"]) == 1
    finals = [json.loads((tm_home / "jobs" / j / "outputs" / "commitment.json").read_text())["final_sha256"]
              for j in (job["id"], whole["id"])]
    assert finals[0] == finals[1]


def _complete_segment(checkpoints: Path) -> bool:
    from trainmaster.backends.segments import newest_segment

    return checkpoints.is_dir() and newest_segment(checkpoints) is not None


def _steps_past(client, handle: Handle, step: int) -> bool:
    from trainmaster.broker.job_progress import last_step, read_tail

    seen = last_step(asyncio.run(read_tail(client, handle)))
    return seen is not None and seen.step >= step


def test_the_executor_refuses_a_bundle_whose_bytes_are_not_the_named_ones(tmp_path, executor):
    bundle = tmp_path / "bundle.tar"
    bundle.write_bytes(b"not the bundle that was named")
    client = RemoteExecutor(url=executor.url)
    with pytest.raises(BackendError, match="sha256 is .* not " + "0" * 64):
        asyncio.run(client._upload(bundle, "0" * 64))
    assert list((executor.home / "bundles").iterdir()) == []


def test_hostile_answers_are_the_executors_fault(tmp_path):
    """An executor (served here, in-process) whose outputs list names a path outside the folder, or whose
    answers are not the protocol's: each call fails as the executor's fault, and nothing is written."""
    from aiohttp import web

    hostile = {"/outputs": {"files": [{"path": "../escaped", "size": 1, "sha256": "0" * 64}]},
               "/status": {"phase": "running", "extra": "not in the protocol"}, "/checkpoint": ["not", "an", "object"]}

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(hostile["/" + request.path.rsplit("/", 1)[1]])

    async def main():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        client = RemoteExecutor(url=f"http://127.0.0.1:{runner.addresses[0][1]}")
        handle = Handle(backend="bittensor", attempt_id="j.1", data={"attempt_id": "j.1", "hotkey": "h"})
        try:
            for call, why in ((client.fetch(handle, tmp_path / "out"), "not a relative path below its folder"),
                              (client.status(handle), "not a valid AttemptStatus of the protocol"),
                              (client.last_checkpoint(handle), "not a JSON object")):
                with pytest.raises(ExecutorFault, match=why):
                    await call
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert list(tmp_path.iterdir()) == []

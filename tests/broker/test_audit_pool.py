"""Verifications run in the audit pool (broker/audit_pool.py), off the broker's process and event loop: the evaluator
is started by a pool worker whose parent is the broker; a worker that dies is our failure (tried again on a fresh
pool, then `cannot_verify`), never the executor's; the event loop keeps its beat during a replay audit whose
challenged segments the worker has the broker open (broker/segment_channel.py)."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from typer.testing import CliRunner

from trainmaster.broker import audit_pool, paths
from trainmaster.broker.cli import app

# a model file by hand (safetensors: 8-byte header length, JSON header, data), so the job needs no torch
MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
"""
# the evaluator notes its parent (the pool worker) and that worker's parent, then kills the worker while
# `TM_TEST_KILLS` names more kills than the notes hold
EVALUATE = """\
import json, os, pathlib, signal
notes = pathlib.Path(os.environ["TM_TEST_NOTES"])
worker = os.getppid()
with open(f"/proc/{worker}/stat") as stat:
    broker = int(stat.read().rsplit(")", 1)[1].split()[1])
seen = notes.read_text().splitlines() if notes.exists() else []
notes.write_text("".join(f"{line}\\n" for line in [*seen, json.dumps({"worker": worker, "broker": broker})]))
if len(seen) < int(os.environ["TM_TEST_KILLS"]):
    os.kill(worker, signal.SIGKILL)
print(json.dumps({"score": 0.5}))
"""
SPEC = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: 0.1\n"


@pytest.fixture
def evaluated_job(job_factory, tmp_path, monkeypatch):
    """Submits a job whose evaluator kills its worker `kills` times; the CLI's result and the evaluator's notes."""
    notes = tmp_path / "notes.jsonl"

    def run(kills: int):
        # through the spec's env: the evaluator is the job's code and inherits nothing else of the broker's
        spec = job_factory(MAKE_MODEL, SPEC + f"env:\n  TM_TEST_NOTES: {notes}\n  TM_TEST_KILLS: '{kills}'\n")
        (spec.parent / "evaluate.py").write_text(EVALUATE)
        result = CliRunner().invoke(app, ["submit", str(spec), "--wait"])
        return result, [json.loads(line) for line in notes.read_text().splitlines()]

    return run


def _only_job() -> str:
    [job_dir] = (paths.home() / "jobs").iterdir()
    return job_dir.name


def _verdict(job_id: str) -> dict:
    return json.loads(CliRunner().invoke(app, ["verify", job_id, "--json"]).output)


def test_the_verification_runs_in_a_worker_process_of_the_broker(tm_home, evaluated_job):
    result, notes = evaluated_job(kills=0)
    assert result.exit_code == 0, result.output
    [note] = notes
    assert note["broker"] == os.getpid() != note["worker"]  # the evaluator's parent is a child of ours
    assert _verdict(_only_job())["outcome"] == "accepted"


def test_a_worker_that_dies_is_our_failure_and_the_verification_is_run_again(tm_home, evaluated_job):
    result, notes = evaluated_job(kills=1)
    assert result.exit_code == 0, result.output
    first, second = notes
    assert first["worker"] != second["worker"] and first["broker"] == second["broker"] == os.getpid()
    verdict = _verdict(_only_job())
    assert verdict["outcome"] == "accepted", verdict


def test_a_worker_that_dies_every_time_leaves_the_attempt_unverified_never_rejected(tm_home, evaluated_job):
    from trainmaster.broker.store import Store

    result, notes = evaluated_job(kills=audit_pool.TRIES)
    assert len(notes) == audit_pool.TRIES and len({n["worker"] for n in notes}) == audit_pool.TRIES
    assert result.exit_code != 0
    job_id = _only_job()
    verdict = _verdict(job_id)
    assert verdict["outcome"] == "cannot_verify", verdict
    assert f"died {audit_pool.TRIES} times" in verdict["reasons"][0]
    store = Store(paths.state_db())
    try:
        job = store.job(job_id)
        assert job.state == "unverified", job.reason
        assert not any(e.to_state == "rejected" for e in store.events(job_id))
    finally:
        store.close()


def test_the_pool_size_comes_from_the_cpu_count_or_the_environment(monkeypatch):
    monkeypatch.delenv(audit_pool.PROCESSES_ENV, raising=False)
    assert audit_pool.size() == max(1, min(audit_pool.DEFAULT_MAX, os.cpu_count() or 1))
    monkeypatch.setenv(audit_pool.PROCESSES_ENV, "3")
    assert audit_pool.size() == 3
    for wrong in ("0", "two"):
        monkeypatch.setenv(audit_pool.PROCESSES_ENV, wrong)
        with pytest.raises(ValueError, match=audit_pool.PROCESSES_ENV):
            audit_pool.size()


def test_a_pool_runs_calls_in_another_process_and_starts_again_after_shutdown():
    pool = audit_pool.AuditPool()

    async def pids():
        return await asyncio.gather(pool.run(os.getpid), pool.run(os.getpid))

    try:
        first = asyncio.run(pids())
        pool.shutdown()
        again = asyncio.run(pids())
    finally:
        pool.shutdown()
    assert os.getpid() not in {*first, *again}
    assert not set(first) & set(again)  # the pool after shutdown is a new one


# 100 AdamW steps of a small transformer, k = 25: 4 segments, all audited
UNTRUSTED_JOB = """\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 100 --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 3
checkpoint:
  segment_steps: 25
"""
UNTRUSTED_POLICY = "name: untrusted\ndefault:\n  primary: bittensor\nverification:\n  tau: 0.01\n"
BEAT_S = 0.02
MAX_GAP_S = 1.0
"""Far above a beat (the machine is shared), far below the audit's length: a loop that ran the audit would miss
beats for seconds."""


@pytest.mark.slow
def test_the_event_loop_keeps_its_beat_while_a_replay_audit_runs(tm_home, tmp_path):
    from untrusted_backend import UntrustedExecutor

    from trainmaster.broker.service import Broker

    (tmp_path / "job.yaml").write_text(UNTRUSTED_JOB)
    (tmp_path / "untrusted.yaml").write_text(UNTRUSTED_POLICY)
    executor = UntrustedExecutor()
    broker = Broker(backends={"bittensor": executor})
    gaps: list[float] = []

    async def beat(stop: asyncio.Event):
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(BEAT_S)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def main():
        stop = asyncio.Event()
        heart = asyncio.create_task(beat(stop))
        try:
            job = await broker.submit(tmp_path / "job.yaml", str(tmp_path / "untrusted.yaml"))
            return await broker.wait(job.id, timeout_s=240)
        finally:
            stop.set()
            await heart

    try:
        done = asyncio.run(main())
    finally:
        broker.close()
        audit_pool.shutdown()
    assert done.state == "accepted", done.reason
    assert executor.opened == [[0, 1, 2, 3]]  # the worker had the broker open the challenged segments
    assert max(gaps) < MAX_GAP_S, max(gaps)


# the broker is killed while its one worker is busy (an idle worker would see its queue close and leave anyway)
KILLED_BROKER = """
import asyncio, os, signal, time
from trainmaster.broker.audit_pool import AuditPool

async def main():
    pool = AuditPool()
    print(await pool.run(os.getpid), flush=True)
    busy = asyncio.ensure_future(pool.run(time.sleep, 60))
    await asyncio.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""


def test_a_kill_9_of_the_broker_takes_its_workers_along():
    import subprocess
    import sys

    import psutil

    done = subprocess.run([sys.executable, "-c", KILLED_BROKER], capture_output=True, text=True, timeout=60,
                          env={**os.environ, audit_pool.PROCESSES_ENV: "1"})
    assert done.returncode == -9, done.stderr
    worker = int(done.stdout)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(worker) and psutil.Process(worker).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the pool's worker outlived its broker"
        time.sleep(0.1)

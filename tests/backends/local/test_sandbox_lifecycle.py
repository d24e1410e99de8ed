"""A confined job is still a job: real torch training produces its outputs and commitment, cancel stops it,
and a kill -9 of its supervisor still ends it (the keeper and the parent-death signal reach its user)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import psutil

from sandbox_support import backend, fetch, log, submit, wait, workdir
from trainmaster.backends.local.config import Sandbox

DQN = "python -m trainmaster.jobs.recipes.dqn --steps 50 --learning-starts 10 --batch-size 8 --buffer-size 100"
SLEEPER = """
    import os, pathlib, time
    pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "uid").write_text(str(os.getuid()))
    time.sleep(600)
"""


def _poll(predicate, timeout: float = 60.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _processes_of(uid: int) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]


def _started_uid(handle) -> int:
    marker = workdir(handle) / "outputs" / "uid"
    assert _poll(lambda: marker.exists() and marker.read_text()), log(handle)
    return int(marker.read_text())


def test_a_confined_torch_job_trains_and_commits(tmp_path):
    local = backend(Sandbox())
    handle = submit(local, tmp_path, "", "checkpoint:\n  segment_steps: 25\n", entrypoint=DQN)
    st = wait(local, handle, timeout=300)
    assert st.phase.value == "succeeded", log(handle)
    files = fetch(local, handle, tmp_path / "out")
    assert "commitment.json" in files, sorted(files)
    commitment = json.loads(files["commitment.json"])
    assert commitment["k"] == 25 and commitment["n"] >= 2, commitment
    assert "confined: user 2" in log(handle)


def test_cancel_stops_a_confined_job(tmp_path):
    local = backend(Sandbox())
    handle = submit(local, tmp_path, SLEEPER)
    uid = _started_uid(handle)
    assert uid >= 2_000_000 and _processes_of(uid)
    asyncio.run(local.cancel(handle))
    assert wait(local, handle).phase.value == "cancelled"
    assert _poll(lambda: not _processes_of(uid)), [p.cmdline() for p in _processes_of(uid)]


def test_killing_the_supervisor_ends_the_confined_job(tmp_path):
    local = backend(Sandbox())
    handle = submit(local, tmp_path, SLEEPER)
    uid = _started_uid(handle)
    supervisor = json.loads((workdir(handle) / "supervisor.json").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    assert _poll(lambda: not _processes_of(uid)), [p.cmdline() for p in _processes_of(uid)]
    assert wait(local, handle).phase.value == "failed"

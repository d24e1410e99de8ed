"""A step of the wall clock while a local job runs (NTP, a laptop or a VM resumed) does not make its live supervisor
look dead: the job runs on to its end and is accepted, nothing of it is killed. On Linux psutil's create_time is the
start since boot plus the boot time, and the boot time moves with such a step; the supervisor's record is shifted by
the same whole seconds here, as a later reading of its start would be (before, `submit --wait` then killed the job
as "died without finishing")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from daemon_support import wait_for

from trainmaster.broker import paths

SCRIPT = """
    import os, pathlib, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    (out / "started").write_text("1")
    while not (out / "go").exists():
        time.sleep(0.05)
    print("the job's last line", flush=True)
"""


@pytest.mark.parametrize("step_s", [1.0, -1.0], ids=["forward", "back"])
def test_a_clock_step_while_the_job_runs_neither_kills_it_nor_fails_it(tm_home, job_factory, step_s):
    spec = job_factory(SCRIPT)
    command = [sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--wait", "--json"]
    waiting = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=os.environ.copy())
    try:
        jobs = tm_home / "jobs"
        wait_for(lambda: jobs.exists() and any(jobs.glob("*/attempts/1/outputs/started")), what="the job's start")
        [out] = jobs.glob("*/attempts/1/outputs")
        workdir = out.parent
        record_file = workdir / "supervisor.json"
        record = json.loads(record_file.read_text())
        shifted = workdir / "supervisor.json.shifted"
        shifted.write_text(json.dumps({**record, "create_time": record["create_time"] + step_s}))
        os.replace(shifted, record_file)  # as the start reads after the step
        time.sleep(1.5)  # `submit --wait` polls the attempt meanwhile
        assert waiting.poll() is None, waiting.communicate()[0]
        (out / "go").write_text("1")
        output, _ = waiting.communicate(timeout=120)
    finally:
        waiting.kill()
    job = json.loads(output[output.index("{"):])
    assert job["state"] == "accepted", output
    [attempt] = job["attempts"]
    assert attempt["state"] == "accepted" and not attempt["reason"], attempt
    assert "the job's last line" in (paths.attempt_dir(job["id"], 1) / "job.log").read_text()

"""A local attempt whose machine rebooted under it ends: its supervisor's record names the boot it started in
(backends/local/processes.py), so a process of the new boot is never taken for that supervisor, whatever pid and
start since boot it has. Before, a record matched by pid and start since boot alone: a process of the next boot
given the same pid at the same clock tick (a service started early in every boot) kept the job `running` forever.

The reboot is played here: the attempt's processes are killed without a word (no `exit.json`, as at a power cut),
and its record is made to name a live stand-in (`sleep`) by its exact pid, create time and start since boot, with
another boot's id. Nobody watches the job but the reads: their background pass must end it, and must not touch the
stand-in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid

import psutil
from test_orphans import NO_PASS, alive, pids, status_once_ended, submitted, supervisor_pid, wait_for

from trainmaster.broker import paths
from trainmaster.jobs.process_start import boot_id, started_since_boot

ONE_PROCESS = """
    import os, pathlib, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    (out / "pid.main").write_text(str(os.getpid()))
    time.sleep(300)
"""


def test_an_attempt_of_an_earlier_boot_ends_and_a_later_process_with_its_pid_and_start_is_left_alone(
        tm_home, job_factory):
    job_id = submitted(job_factory(ONE_PROCESS), env=NO_PASS)
    [main] = pids(job_id, "main")
    record_file = paths.attempt_dir(job_id, 1) / "supervisor.json"
    record = json.loads(record_file.read_text())
    assert record["boot_id"] == boot_id() and record["since_boot"] == started_since_boot(record["pid"])
    os.kill(supervisor_pid(job_id), signal.SIGKILL)  # the power cut: the keeper takes the job along
    assert wait_for(lambda: not alive(main)), "the training process outlived its supervisor"
    assert not (paths.attempt_dir(job_id, 1) / "exit.json").exists()
    later = subprocess.Popen(["sleep", "300"])
    try:
        assert wait_for(lambda: started_since_boot(later.pid) is not None)
        earlier_boot = str(uuid.uuid4())
        stand_in = {**record, "pid": later.pid, "create_time": psutil.Process(later.pid).create_time(),
                    "since_boot": started_since_boot(later.pid), "boot_id": earlier_boot}
        record_file.write_text(json.dumps(stand_in))
        status = status_once_ended(job_id)
        [attempt] = status["attempts"]
        assert status["state"] == "failed" and attempt["state"] == "failed", status
        assert "died without finishing" in attempt["reason"], attempt["reason"]
        assert "were stopped" not in attempt["reason"], attempt["reason"]  # nothing of the new boot taken for its
        time.sleep(0.3)
        assert later.poll() is None, f"the stand-in of the new boot was signalled (exit {later.returncode})"
    finally:
        later.kill()
        later.wait()

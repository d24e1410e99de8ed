"""A step of the wall clock while a local job runs (NTP, a laptop or a VM resumed) does not make its live supervisor
look dead: the job runs on to its end and is accepted, nothing of it is killed. On Linux psutil's create_time is the
start since boot plus the boot time, and the boot time moves with such a step; the supervisor's record is shifted by
the same whole seconds here, as a later reading of its start would be (before, `submit --wait` then killed the job
as "died without finishing")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from daemon_support import wait_for
from test_orphans import NO_PASS, alive, pids, status_once_ended, submitted, supervisor_pid

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


# a daemon the job double-forks with an empty environment (no TRAINMASTER_OUTPUT_DIR to find it by): it stays in the
# supervisor's process group and session, ignores SIGTERM and writes its pid
CLEARED_DAEMON = """
    import os, pathlib, sys, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    stubborn = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
                "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(300)")
    if os.fork() == 0:
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, "-c", stubborn, str(out / "pid.daemon")], {})
        os._exit(0)
    os.wait()
    (out / "pid.main").write_text(str(os.getpid()))
    time.sleep(300)
"""


def test_a_clock_step_after_the_supervisor_died_still_finds_what_its_job_left_in_its_group(tm_home, job_factory):
    """The supervisor and its keeper are killed with -9; the job's daemon, found by the supervisor's process group
    alone, runs on. The wall clock then steps 100 s forward before anyone looks: the supervisor's record and its
    heartbeat's time are moved back by as much, as they read after such a step. The read that finds the supervisor
    dead must still take the daemon for the job's (it started while the supervisor lived, which the heartbeat's
    start since boot says whatever the wall clock did) and stop it. Before, the daemon's start read 100 s after the
    last heartbeat, was taken for a later process's, and ran on after its attempt had ended."""
    job_id = submitted(job_factory(CLEARED_DAEMON), env=NO_PASS)
    main, daemon = pids(job_id, "main", "daemon")
    supervisor = supervisor_pid(job_id)
    keeper = psutil.Process(supervisor).ppid()
    assert "trainmaster.backends.local.keeper" in " ".join(psutil.Process(keeper).cmdline())
    os.kill(keeper, signal.SIGKILL)
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not alive(main) and not alive(supervisor), what="the job's main process and its supervisor gone")
    assert alive(daemon)
    workdir = paths.attempt_dir(job_id, 1)
    record = json.loads((workdir / "supervisor.json").read_text())
    (workdir / "supervisor.json").write_text(json.dumps(
        {**record, "started_at": record["started_at"] - 100, "create_time": record["create_time"] - 100}))
    beat = (workdir / "heartbeat").stat().st_mtime
    os.utime(workdir / "heartbeat", (beat - 100, beat - 100))
    try:
        status = status_once_ended(job_id)
        [attempt] = status["attempts"]
        assert attempt["state"] == "failed" and "1 process(es) it left were stopped" in attempt["reason"], attempt
        wait_for(lambda: not alive(daemon), what="the daemon stopped")
    finally:
        if alive(daemon):
            os.kill(daemon, signal.SIGKILL)


@pytest.mark.parametrize("written", [b"nan", b"inf", b"1e300", b"-5", b"9" * 10_000_000, b"\xff\xfe", b""])
def test_a_heartbeat_the_job_overwrote_is_not_believed(tmp_path, written):
    """The heartbeat sits in the attempt's work dir, where the job could write: a moment that is no moment between
    boot and now (or 10 MB of digits, of which only the first bytes are read) is taken for none, and the wall
    clock's reading is used instead."""
    from trainmaster.backends.local import processes

    beat = tmp_path / "heartbeat"
    beat.write_bytes(written)
    assert processes.heartbeat_since_boot(beat) is None
    beat.write_text("12.500")
    assert processes.heartbeat_since_boot(beat) == 12.5

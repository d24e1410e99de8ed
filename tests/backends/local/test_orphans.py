"""No orphans: a killed supervisor takes its job's processes with it, the attempt ends when they did (not
when the log was last written), and `trainmaster cancel` stops what still runs of a job that already ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
from typer.testing import CliRunner

from background_support import polled
from trainmaster.broker import paths
from trainmaster.broker.cli import app

# a process that ignores SIGTERM (so a parent-death signal alone does not stop it) and writes its pid
STUBBORN = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); "
            "time.sleep(300)")

ONE_PROCESS = """
    import os, pathlib, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    (out / "pid.main").write_text(str(os.getpid()))
    time.sleep(300)
"""

# like a torchrun job: a worker in a session of its own, plus a daemon double-forked into the job's group
TREE = f"""
    import os, pathlib, subprocess, sys, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    subprocess.Popen([sys.executable, "-c", {STUBBORN!r}, str(out / "pid.worker")], start_new_session=True)
    if os.fork() == 0:
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", {STUBBORN!r}, str(out / "pid.daemon")])
        os._exit(0)
    os.wait()
    (out / "pid.main").write_text(str(os.getpid()))
    time.sleep(300)
"""

# exits at once with an error, leaving a double-forked daemon that ignores SIGTERM
LEAVES_A_DAEMON = f"""
    import os, pathlib, sys, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    if os.fork() == 0:
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", {STUBBORN!r}, str(out / "pid.daemon")])
        os._exit(0)
    os.wait()
    while not (out / "pid.daemon").exists():
        time.sleep(0.01)
    sys.exit(1)
"""


NO_PASS = {"TRAINMASTER_BACKGROUND_S": "0"}
"""No background pass is started (broker/cli/background_start.py): nobody watches the job."""


def cli(*args: str, env: dict | None = None):
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    return result


def submitted(spec, env: dict | None = None) -> str:
    result = cli("submit", spec, "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["id"]


def status_once_ended(job_id: str) -> dict:
    """`status --json` read again until the job has ended (the background pass each read starts records it)."""
    return polled(lambda: json.loads(cli("status", job_id, "--json").output),
                  lambda shown: shown["state"] in ("accepted", "failed", "cancelled"), timeout=60)


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def pids(job_id: str, *names: str) -> list[int]:
    out = paths.attempt_dir(job_id, 1) / "outputs"
    assert wait_for(lambda: all((out / f"pid.{n}").exists() for n in names)), "the job did not start its processes"
    return [int((out / f"pid.{n}").read_text()) for n in names]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _mtime(path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def supervisor_pid(job_id: str) -> int:
    return json.loads((paths.attempt_dir(job_id, 1) / "supervisor.json").read_text())["pid"]


def test_a_killed_supervisor_takes_its_process_along_and_ends_the_attempt_then(tm_home, job_factory):
    job_id = submitted(job_factory(ONE_PROCESS), env=NO_PASS)
    [main] = pids(job_id, "main")
    workdir = paths.attempt_dir(job_id, 1)
    log_written = (workdir / "job.log").stat().st_mtime
    # the log was last written at the start: wait for a heartbeat well after it (however slow the machine),
    # so an end taken from the log would be told apart from the end taken from the heartbeat
    assert wait_for(lambda: _mtime(workdir / "heartbeat") - log_written > 1.0)
    beat = _mtime(workdir / "heartbeat")
    os.kill(supervisor_pid(job_id), signal.SIGKILL)
    killed_at = time.time()
    # nobody is watching (no trainmaster command runs, no background pass): the parent-death signal alone stops it
    assert wait_for(lambda: not alive(main)), "the training process outlived its supervisor"
    status = status_once_ended(job_id)
    [attempt] = status["attempts"]
    assert status["state"] == "failed" and attempt["state"] == "failed"
    assert "died without finishing" in attempt["reason"]
    assert beat <= attempt["ended_at"] <= killed_at  # its last heartbeat, not the log's time
    assert abs(attempt["billable_seconds"] - (attempt["ended_at"] - attempt["started_at"])) < 0.01
    again = json.loads(cli("status", job_id, "--json").output)["attempts"][0]
    assert again["ended_at"] == attempt["ended_at"]  # recorded once, in the work dir
    assert json.loads((paths.attempt_dir(job_id, 1) / "exit.json").read_text())["ended_at"] == attempt["ended_at"]


def test_a_killed_supervisor_leaves_no_process_of_the_job(tm_home, job_factory):
    """Its worker in another session and its double-forked daemon ignore SIGTERM; the `submit --wait`
    watching the job finds the supervisor dead and stops them."""
    spec = job_factory(TREE)
    waiting = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--wait"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_for(lambda: (tm_home / "jobs").is_dir() and any((tm_home / "jobs").iterdir()))
        [job_dir] = (tm_home / "jobs").iterdir()
        job_id = job_dir.name
        everything = pids(job_id, "main", "worker", "daemon")
        os.kill(supervisor_pid(job_id), signal.SIGKILL)
        killed_at = time.time()
        assert wait_for(lambda: not any(alive(p) for p in everything)), [p for p in everything if alive(p)]
        out, _ = waiting.communicate(timeout=60)
        returned_at = time.time()
    finally:
        waiting.kill()
    assert waiting.returncode == 1, out
    [attempt] = json.loads(cli("status", job_id, "--json").output)["attempts"]
    assert attempt["state"] == "failed" and "were stopped" in attempt["reason"], attempt["reason"]
    assert killed_at - 0.05 <= attempt["ended_at"] <= returned_at  # when the last of them was stopped


def test_cancel_stops_what_still_runs_of_a_job_that_already_ended(tm_home, job_factory):
    """The job failed (exit 1) leaving a daemon that ignores SIGTERM; its supervisor, stopping it, is
    killed (as by the OOM killer) before the SIGKILL. The job stays failed and the daemon runs on, until
    `trainmaster cancel`."""
    job_id = submitted(job_factory(LEAVES_A_DAEMON))
    workdir = paths.attempt_dir(job_id, 1)
    assert wait_for(lambda: (workdir / "exit.json").exists())
    os.kill(supervisor_pid(job_id), signal.SIGKILL)  # within its grace period for the leftovers
    [daemon] = pids(job_id, "daemon")
    status = status_once_ended(job_id)
    assert status["state"] == "failed" and status["attempts"][0]["state"] == "failed"
    time.sleep(0.5)
    assert alive(daemon)
    result = cli("cancel", job_id)
    assert result.exit_code == 0, result.output
    assert f"{job_id}: failed" in result.output
    assert "attempt 1 (failed) still had 1 process(es) running; stopped them" in result.output
    assert not alive(daemon)
    again = json.loads(cli("cancel", job_id, "--json").output)
    assert again["state"] == "failed" and again["stopped"] == []  # nothing left, nothing claimed


# ignores SIGTERM, writes its pid, then keeps adding to a file of the job's outputs
TICKER = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); "
          "f = open(sys.argv[2], 'a')\n"
          "while True: f.write('.'); f.flush(); time.sleep(0.01)")


def test_an_attempt_ends_only_once_what_its_job_left_running_is_stopped(tm_home, job_factory):
    """The job exits 0 leaving a daemon that ignores SIGTERM and keeps writing into the job's outputs. The attempt
    stays running while its supervisor stops the daemon (SIGTERM, the grace, SIGKILL), so once `submit --wait` has
    fetched and accepted the outputs nothing of the job runs, the log says what was stopped, and the outputs no
    longer change (before, the attempt ended with the job's process and its outputs were fetched meanwhile)."""
    script = f"""
        import os, pathlib, sys, time
        out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
        if os.fork() == 0:
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", {TICKER!r}, str(out / "pid.daemon"),
                                          str(out / "ticks.txt")])
            os._exit(0)
        os.wait()
        while not (out / "ticks.txt").exists():
            time.sleep(0.01)
    """
    result = cli("submit", job_factory(script), "--wait", "--json")
    assert result.exit_code == 0, result.output
    job = json.loads(result.output[result.output.index("{"):])
    assert job["state"] == "accepted", job
    out = paths.attempt_dir(job["id"], 1) / "outputs"
    assert not alive(int((out / "pid.daemon").read_text()))
    assert "the job left 1 process(es) running" in (paths.attempt_dir(job["id"], 1) / "job.log").read_text()
    size = (out / "ticks.txt").stat().st_size
    time.sleep(0.3)
    assert (out / "ticks.txt").stat().st_size == size


def test_a_finished_job_leaves_nothing_running(tm_home, job_factory):
    script = """
        import os, pathlib, subprocess, sys
        out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
        if os.fork() == 0:
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)"])
            os._exit(0)
        os.wait()
        (out / "done.txt").write_text("ok")
    """
    result = cli("submit", job_factory(script), "--wait")
    assert result.exit_code == 0, result.output
    [job_dir] = (tm_home / "jobs").iterdir()
    log = paths.attempt_dir(job_dir.name, 1) / "job.log"
    assert wait_for(lambda: "the job left 1 process(es) running" in log.read_text())
    marker = str(paths.attempt_dir(job_dir.name, 1) / "outputs")

    def leftovers():
        found = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("TRAINMASTER_OUTPUT_DIR") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.pid)
            except psutil.Error:
                continue
        return found

    assert wait_for(lambda: not leftovers()), leftovers()

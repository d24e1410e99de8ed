"""Nothing a job starts outlives its supervisor: `kill -9` of the supervisor, with no trainmaster command
watching, takes along a `bash -c` command's grandchild, a background job, a double-forked daemon and a
child in a session of its own, each ignoring SIGTERM (the keeper, a child subreaper, stops them)."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

# stubborn.py, beside train.py: ignores SIGTERM (so only a SIGKILL stops it), writes its pid to the file named
STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1] + ".tmp", "w").write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""

DOUBLE_FORK = """
    import os, pathlib, sys, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "stubborn.py", str(out / "pid.stray")])
        os._exit(0)
    os.wait()
    time.sleep(600)
"""

NEW_SESSION = """
    import os, pathlib, subprocess, sys, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    subprocess.Popen([sys.executable, "stubborn.py", str(out / "pid.stray")], start_new_session=True)
    time.sleep(600)
"""

RUN_STUBBORN = "python stubborn.py $TRAINMASTER_OUTPUT_DIR/pid.stray"
CASES = {
    # bash runs the command as its child (a second command follows), so the job's process is bash's grandchild
    "bash -c grandchild": (f"bash -c '{RUN_STUBBORN}; echo never'", ""),
    "background job": (f"bash -c '{RUN_STUBBORN} & sleep 600'", ""),
    "double fork": ("python train.py", DOUBLE_FORK),
    "child in a new session": ("python train.py", NEW_SESSION),
}


def wait_for(predicate, timeout: float = 60.0) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def processes_of(marker: str) -> list[int]:
    """Live processes carrying the attempt's output directory in their environment: the job's."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("TRAINMASTER_OUTPUT_DIR") == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_kill_9_of_the_supervisor_leaves_no_process_of_the_job(tm_home, job_factory, case):
    entrypoint, script = CASES[case]
    spec = job_factory(script, entrypoint=entrypoint)
    (spec.parent / "stubborn.py").write_text(STUBBORN)
    submitted = CliRunner().invoke(app, ["submit", str(spec), "--json"])
    assert submitted.exit_code == 0, submitted.output
    workdir = paths.attempt_dir(json.loads(submitted.output)["id"], 1)
    out = workdir / "outputs"
    assert wait_for(lambda: (out / "pid.stray").exists()), (workdir / "job.log").read_text()
    stray = int((out / "pid.stray").read_text())
    everything = processes_of(str(out))
    assert stray in everything and len(everything) >= 2, everything
    supervisor = json.loads((workdir / "supervisor.json").read_text())["pid"]
    keeper = psutil.Process(supervisor).ppid()
    os.kill(supervisor, signal.SIGKILL)
    # no trainmaster command runs from here on: nothing but the keeper can stop them
    # a process killed but still exiting has no environment left to read yet is not a zombie: wait for both
    assert wait_for(lambda: not processes_of(str(out)) and not alive(stray)), (processes_of(str(out)), alive(stray))
    assert wait_for(lambda: not alive(keeper))  # and the keeper does not outlive them either

"""#33 §2: a local launch our own process did not finish is redone, never charged to or blamed on the job.

Through the CLI: `submit --wait` is killed (SIGKILL, tests/cli_kill_at.py) at a fixed point of the launch, then
`status` brings the job up to date. Killed before the keeper started (only the attempt's launch lock, the old
empty `spawned` marker, is left), the next command starts the launch again on the same attempt; killed after the
keeper started, it finds that run and starts no second one. Either way the job ends accepted on its one attempt,
charged once, the script run once. Also: two keepers started for one attempt run one supervisor.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_run import tm
from repo_paths import TESTS

JOB = ("import os, pathlib\nprint('training once')\n"
       "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")
HERE = TESTS


def _killed_submit(point: str, spec: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, str(HERE / "cli_kill_at.py"), point, "submit", str(spec), "--wait"],
                          capture_output=True, text=True, env=env, timeout=120)


def _ended(job_id: str, home: Path, timeout: float = 90) -> dict:
    deadline = time.time() + timeout
    while True:
        shown = json.loads(tm("status", job_id, "--json", home=home).stdout)
        if shown["state"] in ("accepted", "failed", "cancelled") or time.time() > deadline:
            return shown
        time.sleep(0.3)


@pytest.mark.parametrize("point", ["prepare", "keeper"])
def test_a_launch_killed_half_way_is_finished_by_the_next_command(point, tm_home, job_factory):
    spec = job_factory(JOB, "estimated_hours: 0.001\n")
    killed = _killed_submit(point, spec, tm_home)
    assert killed.returncode == -9, killed.stderr
    db = sqlite3.connect(tm_home / "state.db")
    (job_id, state), = db.execute("SELECT id, state FROM jobs").fetchall()
    db.close()
    workdir = tm_home / "jobs" / job_id / "attempts" / "1"
    assert state == "dispatched"
    if point == "prepare":
        assert sorted(p.name for p in workdir.iterdir()) == ["spawned"], list(workdir.iterdir())  # the lock alone
    job = _ended(job_id, tm_home)
    assert job["state"] == "accepted", job
    assert [a["state"] for a in job["attempts"]] == ["accepted"], job["attempts"]
    assert not [e for e in job["events"] if e["kind"] == "error"], job["events"]
    assert (workdir / "job.log").read_text().count("training once") == 1  # one keeper, one supervisor, one run
    spend = json.loads(tm("spend", "--by", "job", "--json", home=tm_home).stdout)
    assert [r["charges"] for r in spend] == [1]


def test_a_second_keeper_of_an_attempt_starts_nothing(tmp_path):
    """Two keepers started for one attempt (a launch repeated after its launcher died just after starting one):
    the one that takes the keeper lock runs the supervisor, the other exits at once."""
    from trainmaster.backends.local import launching
    from trainmaster.jobs.files import write_json_atomic
    from trainmaster.jobs.launch_command import single_process_env

    work = tmp_path / "attempt"
    (work / "code").mkdir(parents=True)
    (work / "outputs").mkdir()
    (work / "code" / "train.py").write_text("import time\nprint('ran')\ntime.sleep(1)\n")
    write_json_atomic(work / "launch.json", {
        "entrypoint": "python train.py", "launcher": "direct", "nproc": 1, "python": sys.executable,
        "python_names": ["python", "python3"], "cwd": str(work / "code"),
        "env": {"TRAINMASTER_OUTPUT_DIR": str(work / "outputs"), **single_process_env()},
        "max_seconds": None, "time_limit": None, "requirements": None, "envs_dir": str(tmp_path / "envs"),
        "sandbox": None})
    keepers = [subprocess.Popen([sys.executable, "-m", "trainmaster.backends.local.keeper", str(work)])
               for _ in range(2)]
    codes = [k.wait(timeout=60) for k in keepers]
    assert codes == [0, 0]
    assert (work / "job.log").read_text().count("ran") == 1
    assert json.loads((work / "exit.json").read_text())["exit_code"] == 0
    assert not launching.launched(work) or (work / "supervisor.json").exists()

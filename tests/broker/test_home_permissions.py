"""What trainmaster keeps is its user's alone: the home 0700 and everything under it 0600/0700 after a run,
whatever the umask of the shell that ran the CLI; a home others could enter is tightened."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from trainmaster.jobs.files import write_json_atomic
from trainmaster.storage.statedb import connect

TRAIN = ("import os, pathlib\nout = pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'])\n"
         "(out / 'out.txt').write_text('ok')\n(out / 'sub').mkdir()\n(out / 'sub' / 'w.txt').write_text('w')\n"
         "os.chmod(out / 'sub' / 'w.txt', 0o666)\n")  # a job that opens its own output to everyone


def tm_with_umask(*args: str, home, umask: int = 0o022) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120, preexec_fn=lambda: os.umask(umask))


def loose(home) -> list[str]:
    """Paths under `home` (itself included) that group or others may read, write or enter (symlinks aside)."""
    found = []
    for path in [home, *home.rglob("*")]:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{path.relative_to(home.parent)} {stat.filemode(mode)}")
    return found


def test_a_run_leaves_nothing_others_can_read_under_the_home(job_factory, tmp_path):
    home = tmp_path / "home"
    spec = job_factory(TRAIN, "env:\n  API_TOKEN: 'tok-123'\n")
    os.chmod(spec.parent / "train.py", 0o755)  # an executable in the code dir stays its owner's alone
    out = tm_with_umask("submit", str(spec), "--wait", home=home)
    assert out.returncode == 0, out.stdout + out.stderr
    names = {p.name for p in home.rglob("*")}
    assert {"state.db", "launch.json", "job.log", "verdict.json", "train.py", "out.txt", "w.txt"} <= names
    assert loose(home) == []
    assert tm_with_umask("ls", "--all", home=home).returncode == 0
    assert loose(home) == []


def test_a_home_others_can_enter_is_tightened_with_a_note(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    out = tm_with_umask("ls", home=home)
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(home.stat().st_mode) == 0o700 and "now 0700" in out.stderr
    assert "now 0700" not in tm_with_umask("ls", home=home).stderr  # said once


def test_library_writers_are_private_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        connect(tmp_path / "db" / "state.db").close()
        write_json_atomic(tmp_path / "x.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "db").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "db" / "state.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "x.json").stat().st_mode) == 0o600

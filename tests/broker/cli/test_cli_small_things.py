"""What a new user ran into: each answer is one clear line and the right exit code, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest


def cli(*args: str, home, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, **kw)


def test_a_name_pattern_error_is_printed_literally(tmp_path):
    (tmp_path / "job.yaml").write_text("name: Bad_Name\nentrypoint: python t.py\n")
    (tmp_path / "t.py").write_text("")
    out = cli("submit", str(tmp_path / "job.yaml"), home=tmp_path / "home")
    assert out.returncode == 1 and "'^[a-z0-9][a-z0-9_.-]{0,62}$'" in out.stderr


@pytest.mark.parametrize("home_kind", ["a file", "a corrupt state.db"])
def test_an_unusable_home_is_one_line_and_exit_2(tmp_path, home_kind):
    if home_kind == "a file":
        home = tmp_path / "home"
        home.write_text("not a folder")
        why = "is a file, not a folder"
    else:
        home = tmp_path / "home"
        home.mkdir(mode=0o700)  # private already: no note about tightening it
        (home / "state.db").write_bytes(b"garbage" * 100)
        why = "file is not a database"
    for command in (["ls"], ["status", "x"], ["spend"]):
        out = cli(*command, home=home)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (command, out.stderr)
        assert out.stderr.count("\n") == 1 and why in out.stderr, (command, out.stderr)


def test_negative_caps_in_a_policy_are_errors(tmp_path):
    policy = tmp_path / "neg.yaml"
    policy.write_text("name: neg\ndefault:\n  primary: local\n  constraints:\n    max_usd_per_hour: -3\n"
                      "budgets:\n  - name: b\n    period: month\n    cap: -5\n")
    out = cli("policy", "check", str(policy), home=tmp_path / "home")
    assert out.returncode == 1
    assert "neg.yaml:5: default.constraints.max_usd_per_hour" in out.stderr and "neg.yaml:9: budgets.0.cap" in out.stderr


def test_ls_limit_0_lists_every_job_and_an_ambiguous_prefix_is_refused_like_status(tmp_path):
    from trainmaster.verify.records import VerdictStore
    from trainmaster.verify.verdict import Verdict

    home = tmp_path / "home"
    home.mkdir()
    store = VerdictStore(home / "state.db")
    for job_id in ("train-aaa1", "train-aaa2"):
        store.record(Verdict(outcome="accepted", checks=["integrity"], job_id=job_id, attempt_id=f"{job_id}.1"))
    store.close()
    shown = cli("verify", "show", "train-aaa", home=home)
    assert shown.returncode == 2 and "matches several jobs: train-aaa1, train-aaa2" in shown.stderr
    assert cli("verify", "show", "train-aaa2", home=home).returncode == 0
    listed = cli("ls", "--all", "--limit", "0", "--json", home=home)
    assert listed.returncode == 0 and json.loads(listed.stdout) == []
    assert cli("ls", "--limit", "-1", home=home).returncode == 2


def _sigint_default() -> None:
    """Ctrl-C's default reaction in the CLI's process: a test run started in the background by a shell without
    job control inherits SIGINT ignored, and a Python started so keeps ignoring it (as `nohup` and `&` mean)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_waiting_leaves_the_job_running_and_says_how_to_stop_it(tmp_path):
    """Synchronised on states, not on output or time: the interrupt is sent once the entrypoint runs (a file it
    writes) and the CLI is waiting (it printed the job's first log line), however slow the machine is."""
    started = tmp_path / "started"
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.yaml").write_text("name: long\nentrypoint: python t.py\n")
    (code / "t.py").write_text(f"import pathlib, time\nprint('working', flush=True)\n"
                               f"pathlib.Path({str(started)!r}).write_text('x')\ntime.sleep(3600)\n")
    home = tmp_path / "home"
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    proc = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(code / "job.yaml"),
                             "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_sigint_default)
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 600  # only a bound on a hang: the loop ends as soon as both have happened
    while not (started.exists() and any("working" in line for line in seen)):
        assert proc.poll() is None and time.time() < deadline, (proc.returncode, seen, started.exists())
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.stderr.read()
    proc.wait(timeout=600)
    reader.join(timeout=60)
    assert proc.returncode == 130, (proc.returncode, err, seen)
    [job_id] = [w.rstrip(".") for w in err.split() if w.startswith("long-")][:1]
    assert "keeps running" in err and f"trainmaster cancel {job_id}" in err, err
    status = cli("status", job_id, "--json", home=home)
    assert json.loads(status.stdout)["state"] == "running", status.stdout
    assert cli("cancel", job_id, home=home).returncode == 0

"""Why a local job ended, in words a person can act on, through the real CLI (#16 §8): a SIGKILL is
named as such (not as the supervisor's note on processes it left), the time limit says which limit and
its value, a failed install quotes pip's `ERROR:` line, and a local-only job that crashed says where
it failed and that no other backend may run it."""

from __future__ import annotations

import json

from cli_run import tm

KILLED_LEAVING_A_CHILD = """\
import os, signal, subprocess
subprocess.Popen(["sleep", "60"])
print("allocating the replay buffer", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
KILLS_ITS_SUPERVISOR = "import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(30)\n"


def _failed(spec, home) -> dict:
    out = tm("submit", str(spec), "--wait", "--json", home=home)
    job = json.loads(out.stdout)
    assert job["state"] == "failed", job
    return job


def test_a_sigkill_is_named_not_the_leftover_processes(tm_home, job_factory):
    job = _failed(job_factory(KILLED_LEAVING_A_CHILD, "estimated_hours: 0.001\n"), tm_home)
    reason = job["attempts"][0]["reason"]
    assert reason.startswith("killed by SIGKILL") and "out-of-memory" in reason, reason
    assert reason.endswith(": allocating the replay buffer") and "process(es)" not in reason, reason


def test_the_time_limit_names_the_limit_and_its_value(tm_home, job_factory):
    job = _failed(job_factory("import time\ntime.sleep(60)\n", "estimated_hours: 0.00001\nlimits:\n  max_hours: 0.0003\n"),
                  tm_home)
    assert "time limit reached: limits.max_hours = 0.0003 (1 s)" in job["attempts"][0]["reason"], job


def test_a_failed_install_quotes_pips_error(tm_home, job_factory):
    spec = job_factory("print('never')\n", "estimated_hours: 0.001\nenvironment:\n  python: requirements\n")
    (spec.parent / "requirements.txt").write_text("--no-index\nno-such-package-for-trainmaster==1.0\n")
    job = _failed(spec, tm_home)
    reason = job["attempts"][0]["reason"]
    assert reason.startswith("installing the requirements failed: ERROR: "), reason
    assert "no-such-package-for-trainmaster" in reason and "the job's log has pip's full output" in reason, reason


def test_a_local_only_crash_says_where_it_failed_and_that_nothing_else_may_run_it(tm_home, job_factory):
    job = _failed(job_factory(KILLS_ITS_SUPERVISOR, "estimated_hours: 0.001\n"), tm_home)
    assert job["reason"].startswith("the process died without finishing"), job["reason"]
    assert "\nthe job failed on local, and no other backend is allowed by the policy 'default' (chain: local)" in job["reason"]
    assert "blocked after a failed attempt" not in job["reason"]
    shown = tm("status", job["id"], home=tm_home).stdout
    assert "\\x0a" not in shown and any(line.startswith("  the job failed on local, and") for line in shown.splitlines())


def test_pips_last_error_line_is_quoted_and_cut():
    from trainmaster.backends.local.venv_cache import pip_error

    output = "Collecting x\nERROR: first\nsomething\nERROR: " + "y" * 1000 + "\n"
    assert pip_error(output).startswith("ERROR: yyy") and len(pip_error(output)) < 400
    assert pip_error("nothing useful\n") == "see the job's log"

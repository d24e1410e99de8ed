"""The daemon's configuration follows its files (a real detached daemon, the CLI): `backends.yaml`, `triggers.yaml`
and the user's policies are re-read when they change, on SIGHUP and on `daemon reload`, validated first; a file that
does not validate leaves the previous configuration in force and says so in `daemon status`; `daemon start` with
a bad file fails at once with its `file:line` message."""

from __future__ import annotations

import json
import os
import signal
import time

from cli_run import tm
from daemon_support import call, daemon_start, kill, token_of, wait_for

JOB = ("import os, pathlib\nprint('MY_VAR=' + os.environ.get('MY_VAR', '<unset>'))\n"
       "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")


def _reloads(home) -> int:
    return (home / "daemon" / "daemon.log").read_text().count("configuration reloaded")


def _my_var(home, spec, env) -> str:
    done = tm("submit", str(spec), "--wait", "--json", home=home, extra_env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    log = tm("logs", json.loads(done.stdout)["id"], home=home, extra_env=env).stdout
    return next(line.split("=", 1)[1] for line in log.splitlines() if line.startswith("MY_VAR="))


def test_backends_yaml_is_followed_and_a_bad_one_leaves_the_old_in_force(tm_home, job_factory):
    env = {"MY_VAR": "from-the-daemon"}
    config = tm_home / "config"
    config.mkdir(parents=True)
    out = daemon_start(tm_home, extra_env=env)
    assert out.returncode == 0, out.stderr
    pid = json.loads((tm_home / "daemon" / "state.json").read_text())["pid"]
    try:
        spec = job_factory(JOB)
        assert _my_var(tm_home, spec, env) == "<unset>"  # not on the allowlist
        (config / "backends.yaml").write_text("local:\n  inherit_env: [MY_VAR]\n")
        wait_for(lambda: _reloads(tm_home) >= 1, 30, "the daemon to see backends.yaml change")
        assert _my_var(tm_home, spec, env) == "from-the-daemon"  # the running daemon uses the new file

        (config / "backends.yaml").write_text("local:\n  inherit_envv: [MY_VAR]\n")  # a typo
        expected = "backends.yaml:2: local.inherit_envv: unknown field; did you mean 'inherit_env'?"
        status = wait_for(lambda: (s := tm("daemon", "status", home=tm_home, extra_env=env)).stdout.count(expected)
                          and s, 30, "status to report the bad file")
        assert "degraded: configuration:" in status.stdout and "previous configuration stays in force" in status.stdout
        assert _my_var(tm_home, spec, env) == "from-the-daemon"  # the old file is still in force
        reloaded = tm("daemon", "reload", home=tm_home, extra_env=env)
        assert reloaded.returncode == 1 and expected in reloaded.stderr

        (config / "backends.yaml").write_text("local:\n  inherit_env: []\n")
        reloaded = tm("daemon", "reload", home=tm_home, extra_env=env)
        assert reloaded.returncode == 0 and "configuration reloaded" in reloaded.stdout
        health = call(json.loads((tm_home / "daemon" / "state.json").read_text())["address"], "GET", "/v1/health",
                      token_of(tm_home))[1]
        assert health["status"] == "ok" and health["problems"] == []
        assert _my_var(tm_home, spec, env) == "<unset>"

        before = _reloads(tm_home)
        os.kill(pid, signal.SIGHUP)
        wait_for(lambda: _reloads(tm_home) > before, 30, "SIGHUP to reload")
    finally:
        kill(pid)


def test_triggers_and_policies_added_while_running_are_taken_up(tm_home, job_factory, tmp_path):
    config = tm_home / "config"
    (config / "policies").mkdir(parents=True)
    out = daemon_start(tm_home)
    assert out.returncode == 0, out.stderr
    state = json.loads((tm_home / "daemon" / "state.json").read_text())
    token = token_of(tm_home)
    try:
        assert call(state["address"], "GET", "/v1/triggers", token)[1] == {"triggers": []}
        spec = job_factory(JOB)
        (config / "triggers.yaml").write_text(f"triggers:\n  - name: nightly\n    spec: {spec}\n    manual: true\n")
        wait_for(lambda: [t["name"] for t in call(state["address"], "GET", "/v1/triggers", token)[1]["triggers"]]
                 == ["nightly"], 30, "the new trigger")
        (config / "policies" / "team.yaml").write_text("name: team\ndefault:\n  primary: local\n")
        wait_for(lambda: _reloads(tm_home) >= 2, 30, "the policy to be read")
        (config / "policies" / "team.yaml").write_text("name: team\ndefault:\n  primery: local\n")  # broken
        wait_for(lambda: "policies/team.yaml:3: default.primery" in json.dumps(
            call(state["address"], "GET", "/v1/health", token)[1]["problems"]), 30, "the broken policy reported")
        status, job = call(state["address"], "POST", "/v1/jobs", token, {"spec": str(spec), "policy": "team"})
        assert status == 201 and job["policy"] == "team"  # the last valid version of it stays in force
    finally:
        kill(state["pid"])


def test_start_with_a_bad_file_fails_at_once_with_its_file_line_message(tm_home):
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "triggers.yaml").write_text(
        "triggers:\n  - name: nightly\n    spec: job.yaml\n    schedul: '0 3 * * *'\n")
    began = time.monotonic()
    out = daemon_start(tm_home)
    assert out.returncode == 2, out.stdout + out.stderr
    assert time.monotonic() - began < 20  # not the 30 s "did not answer" of old
    assert "the daemon did not start: a configuration file does not validate" in out.stderr
    assert "triggers.yaml:4: triggers.0.schedul: unknown field; did you mean 'schedule'?" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tm_home / "daemon" / "state.json").exists()
    foreground = tm("daemon", "start", "--foreground", home=tm_home, timeout=60)
    assert foreground.returncode == 2 and "triggers.0.schedul: unknown field" in foreground.stderr

"""The daemon as a user runs it: a real subprocess on 127.0.0.1, the CLI's commands through its API, the token."""

from __future__ import annotations

import json
import os
import sqlite3
import stat

import pytest
from cli_run import tm
from daemon_support import get, kill, start, wait_for

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\nprint('hello from the job')\n"


@pytest.fixture
def daemon(tm_home):
    state = start(tm_home)
    yield state
    kill(state["pid"])


def test_cli_commands_go_through_the_daemon(daemon, tm_home, job_factory):
    spec = job_factory(TRAIN)
    out = tm("submit", str(spec), "--wait", home=tm_home)
    assert out.returncode == 0, out.stderr
    assert "hello from the job" in out.stdout and "accepted" in out.stdout
    job_id = json.loads(tm("ls", "--all", "--json", home=tm_home).stdout)[0]["id"]
    shown = json.loads(tm("status", job_id, "--json", home=tm_home).stdout)
    assert shown["state"] == "accepted"
    token = (tm_home / "daemon" / "token").read_text().strip()
    assert get(daemon["address"], f"/v1/jobs/{job_id}", token=token) == (200, shown)  # one view: broker/job_view.py
    assert "hello from the job" in tm("logs", job_id, home=tm_home).stdout
    up = json.loads(tm("daemon", "status", "--json", home=tm_home).stdout)
    assert up["running"] and up["pid"] == daemon["pid"] and up["passes"] >= 1
    (tm_home / "daemon" / "token").write_text("not-the-token")  # the CLI now sends a wrong token to the API
    refused = tm("submit", str(spec), home=tm_home)
    assert refused.returncode == 2 and "the daemon says: a valid token is required" in refused.stderr
    assert len(json.loads(tm("ls", "--all", "--json", home=tm_home).stdout)) == 1  # nothing submitted locally


def test_every_request_needs_the_token(daemon, tm_home):
    token_file = tm_home / "daemon" / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token, address = token_file.read_text().strip(), daemon["address"]
    assert address.startswith("http://127.0.0.1:")
    for path in ("/v1/health", "/v1/jobs", "/openapi.json"):
        assert get(address, path)[0] == 401
        assert get(address, path, token=token + "x")[0] == 401
        assert get(address, path, cookie="wrong")[0] == 401
    assert get(address, "/v1/health", cookie=token)[0] == 200
    status, health = get(address, "/v1/health", token=token)
    assert status == 200 and health["pid"] == daemon["pid"]
    assert get(address, "/v1/jobs/nope", token=token) == (404, {"error": "no job 'nope'"})


def test_the_openapi_description_matches_the_routes(daemon, tm_home):
    from trainmaster.broker.daemon import api

    token = (tm_home / "daemon" / "token").read_text().strip()
    status, described = get(daemon["address"], "/openapi.json", token=token)
    assert status == 200 and described["openapi"].startswith("3.")
    routed = {(r.method.lower(), r.path) for r in api.routes}
    documented = {(m, p) for p, ops in described["paths"].items() for m in ops}
    assert routed == documented


def test_stop_is_graceful_and_start_twice_is_one_daemon(daemon, tm_home):
    from trainmaster.jobs.process_start import boot_id, started_since_boot

    written = json.loads((tm_home / "daemon" / "state.json").read_text())  # names its process by start and boot
    assert written["pid"] == daemon["pid"] and written["since_boot"] == started_since_boot(daemon["pid"])
    assert written["boot_id"] == boot_id() is not None
    again = tm("daemon", "start", home=tm_home)
    assert again.returncode == 0 and "already running" in again.stdout
    out = tm("daemon", "stop", home=tm_home)
    assert out.returncode == 0 and f"daemon {daemon['pid']} stopped" in out.stdout
    assert not (tm_home / "daemon" / "state.json").exists()
    assert tm("daemon", "status", home=tm_home).returncode == 3


@pytest.mark.slow
def test_kill_9_during_a_running_job_loses_nothing_and_charges_once(daemon, tm_home, job_factory):
    spec = job_factory("import time\ntime.sleep(4)\n" + TRAIN)
    job_id = json.loads(tm("submit", str(spec), "--json", home=tm_home).stdout)["id"]
    wait_for(lambda: json.loads(tm("status", job_id, "--json", home=tm_home).stdout)["state"] == "running",
             what="the job to run")
    kill(daemon["pid"])  # SIGKILL: no graceful anything, its lease left behind
    again = start(tm_home)
    try:
        done = wait_for(lambda: (s := json.loads(tm("status", job_id, "--json", home=tm_home).stdout))["state"]
                        in ("accepted", "failed") and s, what="the job to end")
    finally:
        kill(again["pid"])
    assert done["state"] == "accepted", done["reason"]
    db = sqlite3.connect(tm_home / "state.db")
    charges = db.execute("SELECT count(*) FROM ledger_entries WHERE kind = 'charge' AND job_id = ?",
                         (job_id,)).fetchone()[0]
    assert charges == 1
    assert os.path.exists(tm_home / "jobs" / job_id / "outputs" / "out.txt")

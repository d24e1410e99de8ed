"""The database is a dependency of the daemon, not its lifeline: a real PostgreSQL server of this module's own is
restarted, stopped and has its sessions ended under a running daemon (detached through `trainmaster daemon start`,
jobs through the CLI and the API), which says so in `/v1/health`, carries on when the server is back, and loses and
doubles nothing; started while the server is down, it waits (bounded) and says why; and one state has one daemon,
found by `daemon status` and `daemon stop` whatever it is doing."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from cli_run import tm
from daemon_support import call, daemon_processes, daemon_start, kill, token_of, wait_for

from trainmaster.storage import statedb

JOB = ("import os, pathlib, time\ntime.sleep(1.5)\n"
       "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")


@pytest.fixture(scope="module")
def server():
    """A server of this module's own: restarting it disturbs no other test's."""
    from postgres_server import MissingServer, PostgresServer

    try:
        started = PostgresServer().start()
    except MissingServer as exc:
        pytest.fail(str(exc))
    yield started
    if started.pid is None:
        started.resume()
    started.stop()


@pytest.fixture
def env(server, tmp_path):
    url = server.database()
    (tmp_path / "shared").mkdir()
    return {"TRAINMASTER_DATABASE_URL": url, "TRAINMASTER_SHARED_STORAGE": str(tmp_path / "shared")}


def _state(home) -> dict:
    return json.loads((home / "daemon" / "state.json").read_text())


def _health(home) -> dict | None:
    try:
        status, health = call(_state(home)["address"], "GET", "/v1/health", token_of(home), timeout=5)
    except OSError:
        return None
    return health if status == 200 else None


def _jobs(home) -> list[dict] | None:
    try:
        status, jobs = call(_state(home)["address"], "GET", "/v1/jobs?all=1&limit=0", token_of(home), timeout=30)
    except OSError:
        return None
    return jobs if status == 200 else None


def _all_ended(home, n: int):
    jobs = _jobs(home)
    return jobs if jobs is not None and len(jobs) == n and all(j["state"] in ("accepted", "failed", "cancelled")
                                                                for j in jobs) else None


def _money(url: str) -> dict[str, list[str]]:
    db = statedb.connect(url)
    try:
        rows = db.execute("SELECT job_id, kind FROM ledger_entries ORDER BY seq").fetchall()
        attempts = db.execute("SELECT job_id, state FROM attempts").fetchall()
    finally:
        db.close()
    found: dict[str, list[str]] = {}
    for job_id, kind in rows:
        found.setdefault(job_id, []).append(kind)
    for job_id, state in attempts:
        found.setdefault(job_id, []).append(f"attempt:{state}")
    return found


def test_restarts_and_ended_sessions_under_the_daemon_lose_and_double_nothing(server, env, tm_home, job_factory):
    out = daemon_start(tm_home, extra_env=env)
    assert out.returncode == 0, out.stderr
    pid = _state(tm_home)["pid"]
    try:
        specs = [job_factory(JOB) for _ in range(6)]
        for spec in specs[:3]:
            assert tm("submit", str(spec), home=tm_home, extra_env=env).returncode == 0
        server.restart()  # pg_ctl restart -m fast: every session the daemon held is ended
        assert wait_for(lambda: (_health(tm_home) or {}).get("status") == "ok", 60, "the daemon to be ok again")
        for spec in specs[3:]:  # the API's own connection came back too
            submitted = tm("submit", str(spec), home=tm_home, extra_env=env)
            assert submitted.returncode == 0, submitted.stderr
        ended = server.terminate_sessions(env["TRAINMASTER_DATABASE_URL"].rsplit("/", 1)[1])
        assert ended >= 3  # the daemon's store, ledger, leases … sessions
        server.restart()
        jobs = wait_for(lambda: _all_ended(tm_home, 6), 240, "every job to end")
        assert [j["state"] for j in jobs] == ["accepted"] * 6, [(j["id"], j["state"], j["reason"]) for j in jobs]
        assert psutil_alive(pid)
        money = _money(env["TRAINMASTER_DATABASE_URL"])
        for job in jobs:  # one reservation and one charge each, one accepted attempt: nothing twice, nothing lost
            assert sorted(money[job["id"]]) == ["attempt:accepted", "charge", "reserve"], (job["id"], money[job["id"]])
        assert (_health(tm_home) or {}).get("status") == "ok"
    finally:
        kill(pid)


def psutil_alive(pid: int) -> bool:
    import psutil

    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def test_health_says_degraded_while_the_server_is_down_and_ok_when_it_is_back(server, env, tm_home, job_factory):
    out = daemon_start(tm_home, extra_env=env)
    assert out.returncode == 0, out.stderr
    pid = _state(tm_home)["pid"]
    try:
        spec = job_factory(JOB)
        server.halt()
        try:
            health = wait_for(lambda: (h := _health(tm_home)) and h["status"] == "degraded" and h, 30,
                              "health to say degraded")
            [problem] = health["problems"]
            assert problem.startswith("database: postgresql://tm@127.0.0.1:") and "is away since" in problem
            status = tm("daemon", "status", home=tm_home, extra_env=env)
            assert status.returncode == 0 and "degraded: database:" in status.stdout
            refused = tm("submit", str(spec), home=tm_home, extra_env=env)  # the daemon answers, the state is away
            assert refused.returncode == 2 and "the daemon says:" in refused.stderr and "Traceback" not in refused.stderr
            time.sleep(3)  # passes keep failing, backing off; the daemon stays up
            assert psutil_alive(pid)
        finally:
            server.resume()
        assert wait_for(lambda: (_health(tm_home) or {}).get("status") == "ok", 60, "health to say ok")
        log = (tm_home / "daemon" / "daemon.log").read_text()
        assert "the database at postgresql://tm@127.0.0.1" in log and "is away" in log and "is back after" in log
        done = tm("submit", str(spec), "--wait", "--json", home=tm_home, extra_env=env, timeout=180)
        assert done.returncode == 0 and json.loads(done.stdout)["state"] == "accepted", done.stderr
    finally:
        kill(pid)


def test_a_start_while_the_server_is_down_waits_and_says_why(server, env, tm_home):
    server.halt()
    results: list = []
    try:
        starting = threading.Thread(target=lambda: results.append(
            daemon_start(tm_home, "--db-wait-s", "90", extra_env=env, timeout=180)))
        starting.start()
        wait_for(lambda: _waiting_run(tm_home), 60, "the daemon to wait for the database")
        status = json.loads(tm("daemon", "status", "--json", home=tm_home, extra_env=env).stdout)
        assert not status["running"] and [o["phase"] for o in status["others"]] == ["waiting"]
        assert "waiting for the database at postgresql://tm@127.0.0.1" in status["others"][0]["message"]
    finally:
        server.resume()
    starting.join()
    [out] = results
    assert out.returncode == 0 and "daemon started" in out.stdout, out.stderr
    assert "waiting for the database at postgresql://tm@127.0.0.1" in out.stderr and "(waiting up to 90 s)" in out.stderr
    kill(_state(tm_home)["pid"])


def _waiting_run(home):
    from trainmaster.broker.daemon import runs

    folder = home / "daemon" / "run"
    return [p for p in folder.glob("*.json") if json.loads(p.read_text())["phase"] == runs.WAITING] \
        if folder.is_dir() else []


def test_a_server_that_never_comes_fails_the_start_with_the_reason(tmp_path, tm_home):
    from postgres_server import _free_port

    url = f"postgresql://tm:s3cret@127.0.0.1:{_free_port()}/nothing"
    began = time.monotonic()
    out = daemon_start(tm_home, "--db-wait-s", "3", extra_env={"TRAINMASTER_DATABASE_URL": url})
    assert out.returncode == 2, out.stdout + out.stderr
    assert time.monotonic() - began < 30
    assert "the daemon did not start: the database at postgresql://tm:***@127.0.0.1" in out.stderr
    assert "did not answer within 3 s" in out.stderr and "Connection refused" in out.stderr
    assert "s3cret" not in out.stdout + out.stderr
    assert daemon_processes(tm_home) == []


def test_a_waiting_daemon_is_found_and_stopped(server, env, tm_home):
    server.halt()
    try:
        threading.Thread(target=lambda: daemon_start(tm_home, "--db-wait-s", "120", extra_env=env, timeout=180),
                         daemon=True).start()
        wait_for(lambda: _waiting_run(tm_home), 60, "the daemon to wait for the database")
        [pid] = daemon_processes(tm_home)
        stopped = tm("daemon", "stop", "--timeout", "10", home=tm_home, extra_env=env)
        assert f"daemon {pid}" in stopped.stdout
        assert daemon_processes(tm_home) == []
    finally:
        server.resume()


def test_one_daemon_per_server_state_across_homes_and_after_a_restart(server, env, tm_home, tmp_path):
    out = daemon_start(tm_home, extra_env=env)
    assert out.returncode == 0, out.stderr
    first = _state(tm_home)
    try:
        other = tmp_path / "other-home"  # another user's home (another host, as far as the lock knows)
        again = daemon_start(other, extra_env=env)
        assert again.returncode == 0 and "already running: a daemon already runs on this state" in again.stdout
        assert f"pid {first['pid']} on {socket.gethostname()}, {first['address']}" in again.stdout
        server.restart()  # the server drops the lock with the session; the daemon takes it again
        wait_for(lambda: (_health(tm_home) or {}).get("status") == "ok", 60, "the daemon to be ok again")
        time.sleep(6)  # a lock check (every 5 s) has run since
        again = daemon_start(other, extra_env=env)
        assert "already running" in again.stdout and f"pid {first['pid']}" in again.stdout, again.stdout + again.stderr
        assert daemon_processes(other) == []
    finally:
        kill(first["pid"])

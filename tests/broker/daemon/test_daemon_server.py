"""The daemon as a server a team can leave running, through its API and the CLI (a real detached daemon on
127.0.0.1): files a request names are read bounded, malformed requests are 4xx and echo nothing, idle connections
can neither exhaust its files nor keep `/v1/health` out, its log stays small, and one state has one daemon."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import psutil
import pytest
from cli_run import tm
from daemon_support import call, daemon_processes, daemon_start, kill, start, token_of

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


@pytest.fixture
def daemon(tm_home):
    state = start(tm_home, "--root", "/")  # every folder: what is refused is refused for what the file is
    yield state
    kill(state["pid"])


def _rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


# 1. every file a request names is read bounded ------------------------------------------------------------------

def test_dev_zero_and_a_fifo_as_spec_or_policy_are_refused_at_once_and_the_api_keeps_answering(
        daemon, tm_home, tmp_path, job_factory):
    token, address = token_of(tm_home), daemon["address"]
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    spec = job_factory(TRAIN)
    before = _rss_mib(daemon["pid"])
    for body in ({"spec": "/dev/zero"}, {"spec": str(fifo)}, {"spec": str(spec), "policy": "/dev/zero"},
                 {"spec": str(spec), "policy": str(fifo)}, {"spec": str(tmp_path)}):
        began = time.monotonic()
        status, answer = call(address, "POST", "/v1/jobs", token, body, timeout=10)
        assert status == 400, (body, answer)
        assert time.monotonic() - began < 5
        named = body["policy"] if "policy" in body else body["spec"]
        assert answer["error"].startswith(f"{named}: is a ") and "not a regular file; it is not read" in answer["error"]
    assert "FIFO" in call(address, "POST", "/v1/jobs", token, {"spec": str(fifo)})[1]["error"]
    assert call(address, "GET", "/v1/jobs", token) == (200, [])  # the jobs API was never blocked
    assert _rss_mib(daemon["pid"]) < before + 50  # nothing was read whole
    submitted = tm("submit", str(spec), "--policy", str(fifo), home=tm_home, timeout=30)  # the CLI's path too
    assert submitted.returncode == 1 and "is a FIFO (named pipe), not a regular file" in submitted.stderr
    assert "Traceback" not in submitted.stderr


def test_a_spec_outside_the_roots_or_relative_is_refused(tm_home, tmp_path, job_factory):
    state = start(tm_home, "--root", str(tmp_path / "job0"))
    try:
        token, address = token_of(tm_home), state["address"]
        inside, outside = job_factory(TRAIN), job_factory(TRAIN)  # job0 (a root), job1 (not)
        assert call(address, "POST", "/v1/jobs", token, {"spec": str(inside)})[0] == 201
        status, answer = call(address, "POST", "/v1/jobs", token, {"spec": str(outside)})
        assert status == 400 and "is outside the folders this daemon reads" in answer["error"]
        status, answer = call(address, "POST", "/v1/jobs", token, {"spec": "job0/job.yaml"})
        assert status == 400 and "give an absolute path" in answer["error"]
        link = tmp_path / "job0" / "elsewhere.yaml"
        link.symlink_to(outside)  # a link under a root to a file outside it is outside
        assert call(address, "POST", "/v1/jobs", token, {"spec": str(link)})[0] == 400
    finally:
        kill(state["pid"])


def test_user_files_are_read_bounded_without_a_daemon_too(tmp_path):
    home = tmp_path / "home"
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    out = tm("policy", "check", str(fifo), home=home, timeout=30)
    assert out.returncode == 1 and "is a FIFO (named pipe), not a regular file" in out.stdout + out.stderr
    (home / "config").mkdir(parents=True)
    os.mkfifo(home / "config" / "triggers.yaml")
    out = tm("daemon", "start", home=home, timeout=60)
    assert out.returncode == 2 and "triggers.yaml: is a FIFO" in out.stderr, out.stderr
    big = tmp_path / "big.yaml"
    big.write_text("name: big\n" + "# padding\n" * 200_000)  # 2 MB of comments
    out = tm("policy", "check", str(big), home=home, timeout=30)
    assert out.returncode == 1 and "over the limit of 1048576 bytes" in out.stdout + out.stderr


# 4. a server's manners -----------------------------------------------------------------------------------------

MALFORMED = ["/v1/jobs?limit=abc", "/v1/jobs?limit=-1", "/v1/jobs?limit=1e3", "/v1/jobs?limit=1001",
             "/v1/jobs?all=maybe", "/v1/jobs/{job}/logs?offset=abc", "/v1/jobs/{job}/logs?offset=1e20",
             "/v1/jobs/{job}/logs?offset=-5", "/v1/jobs/{job}/logs?offset=100000000000000000000"]


def test_every_malformed_query_value_is_a_400_naming_it(daemon, tm_home, job_factory):
    token, address = token_of(tm_home), daemon["address"]
    _, job = call(address, "POST", "/v1/jobs", token, {"spec": str(job_factory(TRAIN))})
    for path in MALFORMED:
        status, answer = call(address, "GET", path.format(job=job["id"]), token)
        assert status == 400, (path, answer)
        assert answer["error"].startswith(path.split("?")[1].split("=")[0] + ": "), (path, answer)
    assert call(address, "GET", "/v1/jobs?limit=0&all=1", token)[0] == 200
    assert call(address, "GET", f"/v1/jobs/{job['id']}/logs?offset=0", token)[0] == 200
    assert "Traceback" not in (tm_home / "daemon" / "daemon.log").read_text()


def test_the_bearer_scheme_is_case_insensitive_and_a_huge_header_is_not_echoed(daemon, tm_home):
    token, address = token_of(tm_home), daemon["address"]
    for scheme in ("bearer", "BEARER", "Bearer"):
        assert call(address, "GET", "/v1/health", token, headers={"Authorization": f"{scheme} {token}"})[0] == 200
    assert call(address, "GET", "/v1/health", token, headers={"Authorization": f"Basic {token}"})[0] == 401
    marker = "Q" * 16384
    status, answer = call(address, "GET", "/v1/health", token, headers={"X-Big": marker})
    assert status == 400 and "QQQQ" not in json.dumps(answer) and "too long" in answer["error"]
    raw = _raw(address, b"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"Z" * 16384 + b"\r\n\r\n")
    assert raw.split(b" ", 2)[1] == b"400" and b"ZZZZ" not in raw
    log = (tm_home / "daemon" / "daemon.log").read_text()
    assert "ZZZZ" not in log and "QQQQ" not in log and "Traceback" not in log


def _raw(address: str, data: bytes, timeout: float = 10) -> bytes:
    host, port = address.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_a_slow_dripping_client_is_closed_and_a_slow_body_times_out(daemon, tm_home):
    from trainmaster.broker.daemon.server import IDLE_TIMEOUT_S

    host, port = daemon["address"].removeprefix("http://").split(":")
    drips = [socket.create_connection((host, int(port)), timeout=5) for _ in range(20)]
    opened = time.monotonic()
    closed = set()
    while len(closed) < len(drips) and time.monotonic() - opened < IDLE_TIMEOUT_S + 20:
        for i, s in enumerate(drips):
            if i in closed:
                continue
            try:
                s.sendall(b"G" if time.monotonic() - opened < 1 else b"E")  # a byte a second, never a full line
                s.setblocking(False)
                if s.recv(1) == b"":
                    closed.add(i)
            except BlockingIOError:
                pass
            except OSError:
                closed.add(i)
            finally:
                s.setblocking(True)
        time.sleep(1)
    assert len(closed) == len(drips), "slow-drip connections outlived the idle timeout"
    assert time.monotonic() - opened < IDLE_TIMEOUT_S + 20
    for s in drips:
        s.close()


def test_1100_idle_connections_under_a_1024_file_limit_leave_health_answering_and_the_log_small(tm_home):
    out = daemon_start(tm_home, nofile=1024)
    assert out.returncode == 0, out.stderr
    address, token = json.loads((tm_home / "daemon" / "state.json").read_text())["address"], token_of(tm_home)
    pid = json.loads((tm_home / "daemon" / "state.json").read_text())["pid"]
    try:
        assert psutil.Process(pid).rlimit(psutil.RLIMIT_NOFILE) == (1024, 1024)
        host, port = address.removeprefix("http://").split(":")
        idle, refused = [], 0
        for _ in range(1100):  # no token needed to hold a connection open
            try:
                idle.append(socket.create_connection((host, int(port)), timeout=5))
            except OSError:
                refused += 1
        worst = 0.0
        for _ in range(20):
            began = time.monotonic()
            status, health = call(address, "GET", "/v1/health", token, timeout=5)
            worst = max(worst, time.monotonic() - began)
            assert status == 200
        assert worst < 2.0, f"/v1/health took {worst:.2f} s"
        assert health["connections"]["limit"] <= 1024 - 256 - 3 * 128 and health["connections"]["closed_idle"] > 0
        assert psutil.Process(pid).num_fds() < 1024
        for s in idle:
            s.close()
        log = tm_home / "daemon" / "daemon.log"
        assert log.stat().st_size < 100_000, log.stat().st_size
        assert "Errno 24" not in log.read_text() and "Too many open files" not in log.read_text()
    finally:
        kill(pid)


def test_the_log_is_rotated_by_size_and_repeated_errors_are_rate_limited(tmp_path):
    import logging

    from trainmaster.broker.daemon import logs

    handler = logs.setup(tmp_path / "daemon.log")
    try:
        for _ in range(10_000):
            logging.getLogger("trainmaster.daemon").error("the same failure: %s", "x" * 100)
        handler.flush()
        text = (tmp_path / "daemon.log").read_text()
        assert text.count("the same failure") == logs.BURST
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    assert isinstance(handler, logging.handlers.RotatingFileHandler) and handler.maxBytes == logs.MAX_BYTES
    assert handler.backupCount == logs.BACKUPS


# 3. one daemon per state -----------------------------------------------------------------------------------------

def test_three_concurrent_starts_give_one_daemon_and_stop_finds_it(tm_home):
    results: list = [None] * 3

    def starting(i: int) -> None:
        results[i] = daemon_start(tm_home, timeout=180)

    threads = [threading.Thread(target=starting, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
    pids = daemon_processes(tm_home)
    assert len(pids) == 1, pids
    started = [r.stdout for r in results if "daemon started" in r.stdout]
    assert len(started) == 1
    for r in results:
        if "daemon started" not in r.stdout:
            assert f"already running" in r.stdout and f"pid {pids[0]}" in r.stdout, r.stdout
    status = json.loads(tm("daemon", "status", "--json", home=tm_home).stdout)
    assert status["running"] and status["pid"] == pids[0] and status["others"] == []
    stopped = tm("daemon", "stop", home=tm_home)
    assert f"daemon {pids[0]} stopped" in stopped.stdout
    assert daemon_processes(tm_home) == []
    assert tm("daemon", "status", home=tm_home).returncode == 3


def test_a_second_daemon_on_the_same_state_names_the_first(tm_home, tmp_path):
    first = start(tm_home)
    try:
        other_home = tmp_path / "other"  # another home, the same state file
        url = f"sqlite:///{tm_home / 'state.db'}"
        out = daemon_start(other_home, extra_env={"TRAINMASTER_DATABASE_URL": url})
        assert out.returncode == 0 and "already running: a daemon already runs on this state" in out.stdout
        assert f"pid {first['pid']} on {socket.gethostname()}, {first['address']}" in out.stdout
        assert daemon_processes(other_home) == []
    finally:
        kill(first["pid"])


def test_a_daemon_keeps_no_zombie_after_running_local_jobs(daemon, tm_home, job_factory):
    for _ in range(2):
        assert tm("submit", str(job_factory(TRAIN)), "--wait", home=tm_home).returncode == 0
    time.sleep(1)
    children = psutil.Process(daemon["pid"]).children()
    assert [c.pid for c in children if c.status() == psutil.STATUS_ZOMBIE] == []


# 6. names resolve against the caller's folder, never the daemon's ------------------------------------------------

def test_a_folder_named_default_where_the_daemon_started_changes_nothing(tm_home, tmp_path, job_factory):
    started_in = tmp_path / "where-it-started"
    (started_in / "default").mkdir(parents=True)
    (started_in / "mine.yaml").write_text("name: wrong\n")  # a relative policy path must not resolve here
    out = daemon_start(tm_home, cwd=started_in)
    assert out.returncode == 0, out.stderr
    pid = json.loads((tm_home / "daemon" / "state.json").read_text())["pid"]
    try:
        caller = tmp_path / "caller"
        caller.mkdir()
        (caller / "mine.yaml").write_text("name: mine\ndefault:\n  primary: local\n")
        spec = job_factory(TRAIN)
        out = tm("submit", str(spec), "--wait", "--json", home=tm_home, cwd=caller)
        assert out.returncode == 0 and json.loads(out.stdout)["state"] == "accepted", out.stderr
        out = tm("submit", str(spec), "--policy", "mine.yaml", "--json", home=tm_home, cwd=caller)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["policy"] == str(caller / "mine.yaml")
    finally:
        kill(pid)


def test_a_body_that_does_not_arrive_in_time_is_a_408_saying_so(monkeypatch):
    """The API's `_body` (every POST's body): one that never completes ends in 408 after api.BODY_TIMEOUT_S."""
    import asyncio

    from aiohttp import web

    from trainmaster.broker.daemon import api

    class Stalled:  # a request whose body never completes
        async def json(self):
            await asyncio.sleep(3600)

    monkeypatch.setattr(api, "BODY_TIMEOUT_S", 0.3)
    began = time.monotonic()
    with pytest.raises(web.HTTPRequestTimeout) as refused:
        asyncio.run(api._body(Stalled(), {"spec"}))
    assert time.monotonic() - began < 5
    assert json.loads(refused.value.text) == {"error": "the body did not arrive within 0 s"}

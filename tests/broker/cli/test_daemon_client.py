"""The CLI's client of a running daemon (broker/cli/daemon_client.py) over aiohttp, the project's one HTTP client
library: a daemon on a unix socket is reached through the real CLI; each call is bounded by its timeout, and a
daemon that stalls, drops the connection or answers something that is not JSON is `Unreachable` with a message
that says which (an OSError: the command exits 2 with it, never a traceback); the read-only commands send the
daemon no request and import no HTTP client."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from aiohttp import web

from cli_run import tm
from daemon_support import kill
from served_app import ServedApp

from trainmaster.broker.cli.daemon_client import Daemon, Unreachable

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


def test_a_daemon_on_a_unix_socket_takes_the_cli_commands(tm_home, job_factory):
    folder = Path(tempfile.mkdtemp(prefix="tm-sock-", dir="/tmp"))  # a socket path is at most 107 bytes
    try:
        started = tm("daemon", "start", "--socket", str(folder / "api.sock"), "--lease-s", "3", home=tm_home, timeout=60)
        assert started.returncode == 0, started.stderr
        state = json.loads((tm_home / "daemon" / "state.json").read_text())
        try:
            assert state["address"] == f"unix:{folder / 'api.sock'}"
            up = json.loads(tm("daemon", "status", "--json", home=tm_home).stdout)
            assert up["running"] and up["pid"] == state["pid"]
            done = tm("submit", str(job_factory(TRAIN)), "--wait", "--json", home=tm_home, timeout=240)
            assert done.returncode == 0, done.stderr
            job = json.loads(done.stdout)
            assert job["state"] == "accepted"
            assert json.loads(tm("status", job["id"], "--json", home=tm_home).stdout)["state"] == "accepted"
        finally:
            kill(state["pid"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def odd_server():
    """/v1/health answers; /stall answers nothing for 3 s; /text is not JSON; /drop closes the connection."""

    async def health(_):
        return web.json_response({"status": "ok"})

    async def stall(_):
        await asyncio.sleep(3)
        return web.json_response({})

    async def text(_):
        return web.Response(text="<html>a proxy's page</html>")

    async def drop(request):
        request.transport.close()
        return web.Response()

    app = web.Application()
    app.add_routes([web.get("/v1/health", health), web.get("/stall", stall), web.get("/text", text),
                    web.get("/drop", drop)])
    served = ServedApp(app)
    yield served.url
    served.stop()


def test_each_call_is_bounded_and_a_bad_answer_says_what_it_was(odd_server):
    daemon = Daemon(odd_server, "t")
    assert daemon.call("GET", "/v1/health") == {"status": "ok"} and daemon.answers()
    began = time.monotonic()
    with pytest.raises(Unreachable, match=r"did not answer GET /stall within 0.5 s"):
        daemon.raw("GET", "/stall", timeout=0.5)
    assert time.monotonic() - began < 3
    with pytest.raises(Unreachable, match=r"answered GET /text with something that is not JSON \(HTTP 200\)"):
        daemon.raw("GET", "/text")
    with pytest.raises(Unreachable, match=r"did not answer GET /drop"):
        daemon.raw("GET", "/drop")
    assert isinstance(Unreachable("x"), OSError)  # exits.guarded: exit 2 with the message
    gone = Daemon("http://127.0.0.1:1", "t")
    assert not gone.answers() and gone.health() is None


def test_reads_send_the_daemon_no_request_and_import_no_http_client(tm_home):
    """`ls` and `status` with a daemon running and a job unfinished read the store the daemon keeps: no request,
    so neither aiohttp nor asyncio is imported (the 0.10 s read budget)."""
    import os
    import subprocess

    from trainmaster.broker import paths
    from trainmaster.broker.daemon import state_file
    from trainmaster.broker.store import Store

    store = Store(paths.state_db())
    store.create_job(job_id="open-1", name="open", workload="development", project=None, spec_json="{}",
                     spec_path="job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")
    store.close()
    (tm_home / "daemon").mkdir(mode=0o700, exist_ok=True)
    state_file.write(state_file.DaemonState(pid=os.getpid(), address="http://127.0.0.1:1", started_at=time.time()))
    probe = ("import json, sys\nsys.argv = ['trainmaster', *json.loads(sys.argv[1])]\n"
             "from trainmaster.broker.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass\n"
             "print('IMPORTED', json.dumps(sorted(m for m in ('aiohttp', 'asyncio', 'trainmaster.broker.service')"
             " if m in sys.modules)), file=sys.stderr)\n")
    for args in (["ls", "--json"], ["status", "open-1", "--json"]):
        done = subprocess.run([sys.executable, "-c", probe, json.dumps(args)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "TRAINMASTER_HOME": str(tm_home)})
        line = next(line for line in done.stderr.splitlines() if line.startswith("IMPORTED "))
        assert json.loads(line.removeprefix("IMPORTED ")) == [], (args, done.stderr)
        assert "open-1" in done.stdout, (args, done.stdout, done.stderr)

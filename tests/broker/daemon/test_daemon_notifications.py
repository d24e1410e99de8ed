"""Job and verdict notifications through a real daemon: each job end and each verdict is POSTed once to the webhook
its policy's budgets name, even across a kill -9 (the outbox in the state database, broker/daemon/notifications.py),
on SQLite and PostgreSQL (the `database` fixture)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import pytest
from cli_run import tm
from daemon_support import kill, start, wait_for

from trainmaster.broker import paths
from trainmaster.broker.daemon.notifications import Notifications
from trainmaster.storage import statedb

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


@pytest.fixture
def receiver():
    """A strict webhook on 127.0.0.1: POST /hook and POST /elsewhere only; yields (base URL, {path: [bodies]})."""
    from aiohttp import web

    received: dict[str, list] = {"/hook": [], "/elsewhere": []}
    loop, started, state = asyncio.new_event_loop(), threading.Event(), {}

    async def hook(request):
        received[request.path].append(await request.json())
        return web.Response(text="ok")

    async def serve():
        app = web.Application()
        app.router.add_post("/hook", hook)
        app.router.add_post("/elsewhere", hook)
        state["runner"] = runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = site._server.sockets[0].getsockname()[1]
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(serve()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield f"http://127.0.0.1:{state['port']}", received
    asyncio.run_coroutine_threadsafe(state["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _policy(home, base: str) -> None:
    """The default policy with a budget that covers every job (→ /hook) and one that covers none (→ /elsewhere)."""
    policies = home / "config" / "policies"
    policies.mkdir(parents=True)
    (policies / "default.yaml").write_text(
        "name: default\ndefault:\n  objective: cheapest\n  primary: local\nbudgets:\n"
        f"  - {{name: all, cap: 1000, webhook: '{base}/hook'}}\n"
        f"  - {{name: other, cap: 1000, project: nobody, webhook: '{base}/elsewhere'}}\n")


def _submit(home, spec) -> str:
    out = tm("submit", str(spec), "--json", home=home)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["id"]


def _undelivered() -> int:
    db = statedb.connect(paths.state_db())
    try:
        return db.execute("SELECT count(*) FROM notifications WHERE delivered_at IS NULL").fetchone()[0]
    finally:
        db.close()


def _state(home, job_id: str) -> str:
    return json.loads(tm("status", job_id, "--json", home=home).stdout)["state"]


@pytest.mark.slow
def test_each_job_end_and_verdict_is_posted_once_across_a_kill_9(database, tm_home, job_factory, receiver):
    base, received = receiver
    _policy(tm_home, base)
    daemon = start(tm_home)
    try:
        slow = _submit(tm_home, job_factory("import time\ntime.sleep(3)\n" + TRAIN))
        wait_for(lambda: _state(tm_home, slow) == "running", what="the slow job to run")
        kill(daemon["pid"])
        daemon = start(tm_home)
        quick, broken = _submit(tm_home, job_factory(TRAIN)), _submit(tm_home, job_factory("raise SystemExit(3)\n"))
        jobs = {slow: "accepted", quick: "accepted", broken: "failed"}
        wait_for(lambda: sorted(b["job"] for b in received["/hook"] if b["kind"] == "job_ended") == sorted(jobs),
                 what="a notification for each job end")
        # delivery is at least once: a kill between a POST's answer and the daemon's mark of it sends it again (the
        # same `id`, for the receiver to drop; notifications.py). The kill comes once every entry is marked
        wait_for(lambda: _undelivered() == 0, what="the daemon to mark every notification delivered")
        kill(daemon["pid"])  # after delivery: the next daemon must not send any of them again
        daemon = start(tm_home)
        quick_again = _submit(tm_home, job_factory(TRAIN))
        wait_for(lambda: any(b["job"] == quick_again and b["kind"] == "job_ended" for b in received["/hook"]),
                 what="the next job's end notification")  # (its verdict's is posted first)
    finally:
        kill(daemon["pid"], sig=15)
    ends = {b["job"]: b["state"] for b in received["/hook"] if b["kind"] == "job_ended"}
    assert ends == {**jobs, quick_again: "accepted"}
    ids = Counter(b["id"] for b in received["/hook"])
    assert [i for i, n in ids.items() if n > 1] == []
    verdicts = {b["job"]: b["outcome"] for b in received["/hook"] if b["kind"] == "verdict"}
    assert verdicts == {slow: "accepted", quick: "accepted", quick_again: "accepted"}
    assert received["/elsewhere"] == []  # a budget that does not cover the jobs is not told of them
    assert _undelivered() == 0


def test_a_first_start_does_not_announce_the_past_and_a_second_collect_makes_nothing(database, broker, tm_home,
                                                                                      job_factory, receiver):
    base, _ = receiver
    _policy(tm_home, base)
    ended = broker.submit(job_factory(TRAIN))
    broker.wait(ended.id, timeout_s=60)
    notes = Notifications(paths.state_db())
    try:
        assert notes.collect() == 0 and notes.pending() == []  # ended before notifications were set up
        later = broker.submit(job_factory(TRAIN))
        broker.wait(later.id, timeout_s=60)
        made = notes.collect()
        assert made >= 1 and {p["job"] for _, _, p in notes.pending()} == {later.id}
        assert notes.collect() == 0
        key, url, _ = notes.pending()[0]
        assert url == f"{base}/hook"
        notes.mark(key, delivered=False)
        assert key in [k for k, _, _ in notes.pending()]  # a failed POST keeps it
        notes.mark(key, delivered=True)
        assert key not in [k for k, _, _ in notes.pending()]
    finally:
        notes.close()

"""A step of the wall clock (NTP, a laptop or a VM resumed) does not hide a live daemon: `daemon status` and `daemon
stop` still find a daemon that waits for its database, through the run file it keeps (broker/daemon/runs.py).

Found by its wall-clock start (psutil's create_time against the time it recorded), a daemon looked like another
process after a forward step of over a second: `status` no longer listed it and removed its file, and `stop` said
"not running" and left it running. No test can step this machine's clock; a step shows to that comparison as the
recorded `started_at` moved back by the step, so the test moves it back 30 s in the daemon's own file (its start
since boot is left as the daemon wrote it, as a real step would leave it).

The daemon rewrites its file after each failed try of the database, at most every 5 s: the test moves the time
right after a rewrite, once the tries are 4 s apart, and checks that no rewrite came in between.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from cli_run import tm
from daemon_support import daemon_processes, daemon_start, wait_for

STEP_S = 30.0


def _file(home):
    files = list((home / "daemon" / "run").glob("*.json")) if (home / "daemon" / "run").is_dir() else []
    return files[0] if len(files) == 1 else None


def _next_rewrite(path, after_ns: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if (mtime := path.stat().st_mtime_ns) != after_ns and json.loads(path.read_text())["phase"] == "waiting":
                return mtime
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"{path} was not rewritten within {timeout} s")


def test_a_waiting_daemon_is_found_and_stopped_after_a_clock_step(tm_home):
    from postgres_server import _free_port

    env = {"TRAINMASTER_DATABASE_URL": f"postgresql://tm@127.0.0.1:{_free_port()}/nothing"}
    threading.Thread(target=lambda: daemon_start(tm_home, "--db-wait-s", "120", extra_env=env, timeout=180),
                     daemon=True).start()
    path = wait_for(lambda: _file(tm_home), 60, "the daemon's run file")
    [pid] = wait_for(lambda: daemon_processes(tm_home), 60, "the daemon's process")
    try:
        mtime = 0
        for _ in range(5):  # the tries' waits grow 0.25, 0.5, 1, 2, 4 s: act once the next is ≥ 4 s away
            mtime = _next_rewrite(path, mtime, 30)
        for _ in range(3):
            mtime = _next_rewrite(path, mtime, 30)
            run = json.loads(path.read_text())
            assert run["pid"] == pid, run
            path.write_text(json.dumps({**run, "started_at": run["started_at"] - STEP_S}))
            shifted = path.stat().st_mtime_ns
            status = tm("daemon", "status", "--json", home=tm_home, extra_env=env)
            if path.exists() and path.stat().st_mtime_ns != shifted:
                continue  # the daemon rewrote its file meanwhile: the status did not see the step; again
            shown = json.loads(status.stdout)
            assert not shown["running"] and [(o["pid"], o["phase"]) for o in shown["others"]] == [(pid, "waiting")], \
                status.stdout + status.stderr
            assert path.exists()  # a live daemon's file is kept
            path.write_text(json.dumps({**json.loads(path.read_text()), "started_at": run["started_at"] - STEP_S}))
            stopped = tm("daemon", "stop", "--timeout", "10", home=tm_home, extra_env=env)
            assert f"daemon {pid} stopped" in stopped.stdout, stopped.stdout + stopped.stderr
            break
        else:
            raise AssertionError("the daemon rewrote its file before every status: the step was never seen")
        assert daemon_processes(tm_home) == []
    finally:
        for left in daemon_processes(tm_home):
            os.kill(left, signal.SIGKILL)

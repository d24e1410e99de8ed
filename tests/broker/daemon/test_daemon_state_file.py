"""The daemon's state file names its process by pid and start since boot (broker/daemon/state_file.py).

A daemon killed with -9 leaves `<home>/daemon/state.json` behind. Once its pid is given to another process, a pid
check alone took that process for the daemon: `trainmaster daemon stop` sent it SIGTERM, and SIGKILL after
`--timeout`. The test's stand-in for that later process is a `sleep` whose pid the file names, with the start since
boot a daemon that had the pid earlier would have recorded (5 s before the sleep's own).
"""

from __future__ import annotations

import json
import subprocess
import time

from cli_run import tm

from trainmaster.broker.daemon import state_file
from trainmaster.jobs.process_start import started_since_boot


def _sleeper() -> subprocess.Popen:
    proc = subprocess.Popen(["sleep", "300"])
    deadline = time.monotonic() + 30
    while started_since_boot(proc.pid) is None:  # /proc shows it once it runs
        assert time.monotonic() < deadline, "the stand-in process never showed in /proc"
        time.sleep(0.05)
    return proc


def _write(home, pid: int, **since) -> None:
    (home / "daemon").mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "daemon" / "state.json").write_text(json.dumps(
        {"pid": pid, "address": "http://127.0.0.1:1", "started_at": time.time() - 60, **since}))


def test_daemon_stop_never_signals_a_later_process_given_a_dead_daemons_pid(tm_home):
    later = _sleeper()
    try:
        _write(tm_home, later.pid, since_boot=started_since_boot(later.pid) - 5.0)
        done = tm("daemon", "stop", "--timeout", "2", home=tm_home)
        assert done.returncode == 0 and "not running" in done.stdout, done.stdout + done.stderr
        time.sleep(0.5)
        assert later.poll() is None, f"daemon stop signalled pid {later.pid}, not a daemon (exit {later.returncode})"
        assert state_file.read() is None
    finally:
        later.kill()
        later.wait()


def test_the_state_of_the_process_that_wrote_it_is_read_and_an_older_files_by_its_pid(tm_home):
    writer = _sleeper()
    try:
        _write(tm_home, writer.pid, since_boot=started_since_boot(writer.pid))
        assert state_file.read().pid == writer.pid
        _write(tm_home, writer.pid)  # an older version's file: no start since boot, the pid alone
        found = state_file.read()
        assert found.pid == writer.pid and found.since_boot is None
    finally:
        writer.kill()
        writer.wait()
    assert state_file.read() is None  # gone: no daemon, whatever the file says


def test_a_daemon_writes_its_start_since_boot(tm_home):
    state = state_file.mine("http://127.0.0.1:1", time.time())
    assert state.since_boot == started_since_boot(state.pid)

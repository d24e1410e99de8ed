"""The daemon's state file names its process by pid and start since boot (broker/daemon/state_file.py).

A daemon killed with -9 leaves `<home>/daemon/state.json` behind. Once its pid is given to another process, a pid
check alone took that process for the daemon: `trainmaster daemon stop` sent it SIGTERM, and SIGKILL after
`--timeout`. The test's stand-in for that later process is a `sleep` whose pid the file names, with the start since
boot a daemon that had the pid earlier would have recorded (5 s before the sleep's own), or its exact start since boot
with another boot's id (a daemon of the boot before a reboot).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest
from cli_run import tm

from trainmaster.broker.daemon import runs, state_file
from trainmaster.jobs.process_start import boot_id, started_since_boot


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


@pytest.mark.parametrize("earlier", ["start", "boot"])
def test_daemon_stop_never_signals_a_later_process_given_a_dead_daemons_pid(tm_home, earlier):
    """`start`: a daemon of this boot that had the pid 5 s before. `boot`: one of the boot before a reboot, with
    the very pid and start since boot (a service started early in every boot): the file's boot id tells them apart."""
    later = _sleeper()
    try:
        since = started_since_boot(later.pid)
        _write(tm_home, later.pid, **({"since_boot": since - 5.0} if earlier == "start" else
                                      {"since_boot": since, "boot_id": str(uuid.uuid4())}))
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
        _write(tm_home, writer.pid, since_boot=started_since_boot(writer.pid), boot_id=boot_id())  # this boot's
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


def test_a_run_file_of_an_earlier_boot_is_no_live_daemon(tm_home):
    later = _sleeper()
    try:
        folder = tm_home / "daemon" / "run"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        run = {"pid": later.pid, "started_at": time.time(), "phase": "running", "address": "http://127.0.0.1:1",
               "since_boot": started_since_boot(later.pid)}
        (folder / f"{later.pid}.json").write_text(json.dumps({**run, "boot_id": str(uuid.uuid4())}))
        assert runs.live() == []
        shown = tm("daemon", "status", home=tm_home)
        assert str(later.pid) not in shown.stdout, shown.stdout
        (folder / f"{later.pid}.json").write_text(json.dumps({**run, "boot_id": boot_id()}))
        assert [r.pid for r in runs.live()] == [later.pid]
        assert later.poll() is None
    finally:
        later.kill()
        later.wait()

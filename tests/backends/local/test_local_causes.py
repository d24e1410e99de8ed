"""The local backend says why an attempt ended (`AttemptStatus.cause`): the script's own exit (its
memory included, said so), a vanished supervisor (lost), or a cancel."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from typer.testing import CliRunner

from trainmaster.backends.base import Cause, Phase
from trainmaster.backends.local import oom
from trainmaster.backends.local.backend import _status
from trainmaster.broker import paths


def _ended(workdir, **exit_record) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "supervisor.json").write_text(json.dumps({"pid": 1, "create_time": 0.0, "started_at": 1.0}))
    record = {"reason": None, "cancelled": False, "started_at": 1.0, "ended_at": 2.0, **exit_record}
    (workdir / "exit.json").write_text(json.dumps(record))


@pytest.mark.parametrize(("record", "cause", "said"), [
    ({"exit_code": 1}, Cause.script_failed, "exited with code 1"),
    ({"exit_code": 124, "reason": "time limit reached"}, Cause.script_failed, "time limit reached"),
    ({"exit_code": -9, "oom_killed": True}, Cause.script_failed, "killed by the kernel's out-of-memory killer"),
    ({"exit_code": -9, "oom_killed": None}, Cause.script_failed, "by the kernel's out-of-memory killer or by hand"),
    ({"exit_code": 137, "oom_killed": False}, Cause.script_failed, "not by the out-of-memory killer"),
    ({"exit_code": None, "reason": "the process died without finishing (killed or crashed)"}, Cause.lost, "died"),
    ({"exit_code": None, "reason": "cancelled", "cancelled": True}, Cause.cancelled, "cancelled"),
])
def test_each_end_has_its_cause(tmp_path, record, cause, said):
    _ended(tmp_path, **record)
    st = _status(tmp_path)
    assert st.cause is cause and said in st.reason, st
    assert st.phase is (Phase.cancelled if cause is Cause.cancelled else Phase.failed)


def test_a_success_has_no_cause(tmp_path):
    _ended(tmp_path, exit_code=0)
    assert _status(tmp_path).cause is None


def test_the_oom_killer_is_told_by_the_cgroup_count_rising():
    assert oom.killed_for_memory(-9, 3, 4) is True
    assert oom.killed_for_memory(-9, 3, 3) is False
    assert oom.killed_for_memory(137, None, 3) is None
    assert oom.killed_for_memory(1, 3, 4) is False  # an ordinary exit, whatever else the cgroup saw
    assert oom.kills() is None or oom.kills() >= 0


@pytest.mark.parametrize(("line", "counter", "text"), [
    ("0::/user.slice/job", "user.slice/job/memory.events", "low 0\nhigh 0\noom 2\noom_kill 2\n"),
    ("4:memory:/docker/abc", "memory/docker/abc/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"),
    ("4:cpu,memory:/elsewhere", "memory/memory.oom_control", "oom_kill 7\n"),  # a container sees its own at the root
])
def test_the_oom_kill_count_is_read_from_cgroup_v1_and_v2(tmp_path, line, counter, text):
    proc = tmp_path / "cgroup"
    proc.write_text(f"9:name=systemd:/\n{line}\n")
    (tmp_path / counter).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / counter).write_text(text)
    assert oom.kills(proc, tmp_path) == int(text.rsplit(" ", 1)[1])
    (tmp_path / counter).unlink()
    assert oom.kills(proc, tmp_path) is None


def test_through_the_cli_a_job_killed_by_sigkill_fails_saying_so(tm_home, job_factory):
    from trainmaster.broker.cli import app

    spec = job_factory("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = CliRunner().invoke(app, ["submit", str(spec), "--wait", "--json"])
    assert result.exit_code == 1, result.output
    shown = json.loads(result.output[result.output.index("{"):])
    [attempt] = shown["attempts"]
    assert attempt["state"] == "failed" and "killed by SIGKILL" in attempt["reason"], attempt
    assert "killed by SIGKILL" in shown["reason"]  # the script's own end: no fallback, nothing else tried


def test_through_the_cli_a_vanished_supervisor_is_lost(tm_home, job_factory):
    from trainmaster.broker.cli import app

    submitted = CliRunner().invoke(app, ["submit", str(job_factory("import time\ntime.sleep(60)\n")), "--json"])
    job_id = json.loads(submitted.output[submitted.output.index("{"):])["id"]
    record = paths.attempt_dir(job_id, 1) / "supervisor.json"
    while not record.exists():
        time.sleep(0.05)
    os.killpg(json.loads(record.read_text())["pid"], signal.SIGKILL)
    deadline = time.time() + 60
    while True:
        shown = json.loads(CliRunner().invoke(app, ["status", job_id, "--json"]).output)
        if shown["state"] == "failed" or time.time() > deadline:
            break
        time.sleep(0.2)
    [attempt] = shown["attempts"]
    assert attempt["state"] == "failed" and "died without finishing" in attempt["reason"], attempt
    ends = [e["detail"]["cause"] for e in shown["events"] if e["kind"] == "attempt" and e["to"] == "failed"]
    assert ends == ["lost"]

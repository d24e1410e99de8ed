"""Reads never write (#34 item 4), through the real CLI: `ls`, `status` and `spend` with unfinished jobs answer from
the state as recorded and do not advance a job themselves; the background pass a read starts
(broker/cli/background.py) takes the job to its end, at most one per home; a registry that is down costs a read
nothing (the promotion waits, with its message, for a later pass). And the lean read path (broker/cli/lean.py,
plain.py) prints exactly what Rich prints, line for line."""

from __future__ import annotations

import io
import json
import os
import time

import pytest
from cli_run import tm

SLEEPER = """\
import os, pathlib, time
time.sleep(float(os.environ.get("NAP", "1")))
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "r.json").write_text("{}")
"""


def _state(home, job_id: str, **env) -> dict:
    done = tm("status", job_id, "--json", home=home, extra_env=env)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def _until(home, job_id: str, states: set[str], timeout: float = 120) -> dict:
    deadline = time.time() + timeout
    while True:
        job = _state(home, job_id)
        if job["state"] in states or time.time() > deadline:
            return job
        time.sleep(0.5)


def test_a_read_does_not_advance_a_job_and_the_background_pass_it_starts_ends_it(tm_home, job_factory):
    spec = job_factory(SLEEPER, name="lean")
    no_pass = {"TRAINMASTER_BACKGROUND_S": "0"}  # a background pass that stops at once: only the reads are left
    submitted = tm("submit", str(spec), "--json", home=tm_home, extra_env=no_pass)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    time.sleep(3)  # the script has ended: a reconcile pass would record it returned, verify it, accept it
    for args in (["ls", "--json"], ["status", job_id, "--json"], ["spend"], ["logs", job_id]):
        done = tm(*args, home=tm_home, extra_env=no_pass)
        assert done.returncode == 0, (args, done.stderr)
    before = _state(tm_home, job_id, **no_pass)
    assert before["state"] == "running", before["state"]  # no read moved it
    assert not [e for e in before["events"] if e["to"] in ("returned", "verifying", "accepted")]
    started = time.monotonic()
    listed = tm("ls", home=tm_home)  # this one starts a background pass, and does not wait for it
    assert listed.returncode == 0 and "running" in listed.stdout, listed.stdout
    assert time.monotonic() - started < 10
    ended = _until(tm_home, job_id, {"accepted", "failed"})
    assert ended["state"] == "accepted", ended
    assert "background pass" not in listed.stderr


def test_at_most_one_background_pass_runs_per_home(tm_home):
    from trainmaster.broker.cli import background_start as background

    tm_home.mkdir(parents=True)
    held = background.try_lock(tm_home)
    try:
        assert held is not None and background.running(tm_home)
        assert background.start(tm_home) is False  # one runs: no second is spawned
        assert background.try_lock(tm_home) is None
    finally:
        os.close(held)
    assert not background.running(tm_home)


MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
"""


def test_a_registry_that_is_down_costs_a_read_nothing_and_the_promotion_says_why(tm_home, job_factory):
    import mlflow_server

    (tm_home / "config").mkdir(parents=True)
    dead = f"http://127.0.0.1:{mlflow_server.free_port()}"  # nothing listens there
    (tm_home / "config" / "registry.yaml").write_text(f"mlflow:\n  tracking_uri: {dead}\n  timeout_s: 3\n  retries: 0\n")
    spec = job_factory(MAKE_MODEL, "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: 0.5\n",
                       name="offline")
    (spec.parent / "evaluate.py").write_text('import json\nprint(json.dumps({"score": 0.9}))\n')
    done = tm("submit", str(spec), "--wait", "--json", home=tm_home, timeout=240)
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout[done.stdout.index("{"):])["id"]
    for args in (["ls"], ["status", job_id], ["spend"], ["models", "ls"]):
        started = time.monotonic()
        read = tm(*args, home=tm_home)
        assert read.returncode == 0, (args, read.stderr)
        assert time.monotonic() - started < 3, args  # never the registry's timeout, let alone its retries
    models = json.loads(tm("models", "ls", "--json", home=tm_home).stdout)
    assert models[0]["state"] == "pending" and f"MLflow at {dead}" in models[0]["error"], models


class Hung:
    """A registry's server that is down the worst way: it accepts each connection and never answers. Counts them."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list = []
        threading.Thread(target=self._hold, daemon=True).start()

    def _hold(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_registry_that_hangs_costs_one_short_timeout_once_with_a_message(tm_home, job_factory):
    """Every outward call has a timeout: a tracking server that accepts and never answers costs the `submit --wait`
    that promotes one request's timeout, with a message saying what waits and until when; the reads after it do
    not wait on it, and neither they nor the background passes they start ask it again before its retry time."""
    from background_support import polled
    from trainmaster.broker.cli import background_start

    hung = Hung()
    try:
        (tm_home / "config").mkdir(parents=True)
        (tm_home / "config" / "registry.yaml").write_text(f"mlflow:\n  tracking_uri: {hung.url}\n  timeout_s: 2\n"
                                                          "  retries: 0\n")
        spec = job_factory(MAKE_MODEL, "verification:\n  evaluator: python evaluate.py\n  thresholds:\n"
                                       "    score: 0.5\n", name="hung")
        (spec.parent / "evaluate.py").write_text('import json\nprint(json.dumps({"score": 0.9}))\n')
        done = tm("submit", str(spec), "--wait", "--json", home=tm_home, timeout=240)
        assert done.returncode == 0, done.stderr  # the job is accepted; its promotion waits
        job_id = json.loads(done.stdout[done.stdout.index("{"):])["id"]
        assert len(hung.held) == 1, len(hung.held)  # one request, its one timeout
        said = " ".join(done.stderr.split())  # as wrapped to the terminal's width
        assert said.count("the model registry is down") == 1, said
        assert "timed out" in said and f"the promotion of {job_id} waits, and is tried again" \
            " after" in said, said
        for args in (["ls"], ["status", job_id], ["spend"], ["models", "ls"], ["status", job_id, "--json"]):
            started = time.monotonic()
            read = tm(*args, home=tm_home)
            assert read.returncode == 0, (args, read.stderr)
            assert time.monotonic() - started < 2, args  # never the registry's timeout
        assert polled(lambda: background_start.running(tm_home), lambda runs: not runs, timeout=60) is False
        assert len(hung.held) == 1  # the passes those reads started left it alone (tried again after 2 minutes)
        models = json.loads(tm("models", "ls", "--json", home=tm_home).stdout)
        assert models[0]["state"] == "pending" and f"MLflow at {hung.url}" in models[0]["error"], models
    finally:
        hung.close()


# --- the lean path prints what Rich prints ---------------------------------------------------------------------------


@pytest.fixture
def varied_home(tm_home):
    """Jobs in several states, one with a long reason; as the Store records them."""
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    store = Store(paths.state_db())
    try:
        for i, (state, reason) in enumerate([("cancelled", "cancelled by the user"),
                                             ("failed", "the script exited with 1: " + "word " * 30),
                                             ("planned", None), ("submitted", None)]):
            job_id = f"job-{i}-{'x' * (i * 7)}"
            store.create_job(job_id=job_id, name="n", workload="development", project=None, spec_json="{}",
                             spec_path="job.yaml", bundle_sha256=f"{i}" * 64, policy="default", policy_json="{}")
            if state != "submitted":
                store.move_job(job_id, state, reason=reason)
    finally:
        store.close()
    return tm_home


def _rich_ls(width: int, wide: bool, all_: bool = True) -> str:
    from rich.console import Console

    from trainmaster.broker.cli import render
    from trainmaster.broker.cli.local_jobs import read_jobs

    out = io.StringIO()
    view, jobs = read_jobs(None, -1, None if all_ else time.time() - 86400, advance=False)
    render.print_jobs(Console(file=out, width=width, emoji=False), view, jobs, recent_only=not all_, wide=wide)
    view.store.close()
    return out.getvalue()


@pytest.mark.parametrize("width", [30, 50, 80, 200])
@pytest.mark.parametrize("wide", [False, True])
def test_lean_ls_prints_what_rich_prints(varied_home, monkeypatch, width, wide):
    from trainmaster.broker.cli import lean

    monkeypatch.setenv("COLUMNS", str(width))
    got = lean._ls(all_=True, limit=0, as_json=False, wide=wide)
    assert got is not None or width < 80  # a line Rich would fold is left to Rich
    if got is not None:
        assert got[0] == _rich_ls(width, wide)


@pytest.mark.parametrize("width", [60, 120, 250])
def test_lean_status_prints_what_rich_prints_or_leaves_it_to_rich(varied_home, monkeypatch, width):
    from rich.console import Console

    from trainmaster.broker.cli import lean, render
    from trainmaster.broker.cli.local_jobs import read_jobs, read_status

    monkeypatch.setenv("COLUMNS", str(width))
    view, jobs = read_jobs(None, -1, None, advance=False)
    view.store.close()
    answered = 0
    for job in jobs:
        got = lean._status(job.id, as_json=False)
        view, found = read_status(job.id, advance=False)
        out = io.StringIO()
        render.print_job(Console(file=out, width=width, emoji=False), view, found, events=True)
        view.store.close()
        if got is not None:
            answered += 1
            assert got[0] == out.getvalue(), job.id
    assert answered >= (len(jobs) if width >= 250 else 1)


@pytest.mark.parametrize("by", [None, "backend", "job"])
def test_lean_spend_prints_what_rich_prints(tm_home, monkeypatch, by):
    from rich.console import Console

    from trainmaster.broker.cli import cost, lean

    tm_home.mkdir(parents=True)
    monkeypatch.setenv("COLUMNS", "80")
    got = lean._spend(by=by, as_json=False)
    out = io.StringIO()
    rows, _, _ = cost._spend_rows(by)
    Console(file=out, width=80, emoji=False).print(cost._spend_table(rows, by))
    assert got is not None and got[0] == out.getvalue()


def test_lean_and_typer_agree_on_the_spend_groups():
    from trainmaster.broker.cli import cost, jobs, lean

    assert lean.SPEND_GROUPS == cost.SPEND_GROUPS and lean.RECENT_S == jobs.RECENT_S


def test_anything_but_the_plain_forms_is_left_to_typer(varied_home):
    from trainmaster.broker.cli import lean

    for args in (["ls", "--help"], ["ls", "--limit"], ["ls", "-x"], ["status"], ["status", "a", "b"],
                 ["status", "no-such-job"], ["spend", "--by", "color"], ["spend", "--plot", "x.png"]):
        assert lean.answer(args) is None, args
    unknown = tm("status", "no-such-job", home=varied_home)
    assert unknown.returncode == 2 and "no-such-job" in unknown.stderr

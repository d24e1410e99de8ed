"""Disk is given back: an accepted trusted run keeps only its last segment and those its audit opened
(at once, by the retention policy, or later by `trainmaster gc`), job environments are kept by least
recent use within the cap (never one in use), and `gc [--dry-run] [--json]` says what it frees per kind.

The broker decides which segments to keep; the attempt's backend walks, sizes and removes them
(`ReleasesSegments`): the broker never opens a backend's scratch folder (issue #15 §1). The tests look
into the local backend's folder (`paths.attempt_dir`) only to check what it did."""

from __future__ import annotations

import ast
import asyncio
import fcntl
import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from background_support import polled
from trainmaster.backends.base import Handle
from trainmaster.backends.local.backend import LocalBackend
from trainmaster.broker import paths
from trainmaster.broker.cli import app
from repo_paths import ROOT

TINY_LM = """\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 100 --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 5
checkpoint:
  segment_steps: 25
"""

AUDITED_DQN = """\
name: dqn
entrypoint: python -m trainmaster.jobs.recipes.dqn --steps 300 --learning-starts 50 --batch-size 16 --buffer-size 500
seed: 4
checkpoint:
  segment_steps: 25
verification:
  replay_audit: always
  challenge_segments: 4
"""


def cli(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def gc(*args: str) -> dict:
    result = cli("gc", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def retention(text: str) -> None:
    paths.config_dir().mkdir(parents=True, exist_ok=True)
    (paths.config_dir() / "retention.yaml").write_text(text)


def accepted(spec) -> str:
    out = cli("submit", spec, "--wait", "--json")
    assert out.exit_code == 0, out.output
    job = json.loads(out.output[out.output.index("{"):])
    assert job["state"] == "accepted"
    return job["id"]


def segments(job_id: str) -> dict[int, int]:
    """Segment index → bytes, of the job's first attempt."""
    base = paths.attempt_dir(job_id, 1) / "checkpoints" / "segments"
    return {int(p.name): sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in base.iterdir()}


@pytest.mark.slow
def test_gc_drops_the_segments_of_an_accepted_run_but_the_last_and_says_how_much(tm_home, tmp_path):
    retention("drop_accepted_segments: false\n")  # kept at acceptance: gc finds them
    (tmp_path / "job.yaml").write_text(TINY_LM)
    job_id = accepted(tmp_path / "job.yaml")
    before = segments(job_id)
    assert sorted(before) == [0, 1, 2, 3, 4]

    retention("drop_accepted_segments: true\n")
    would = gc("--dry-run")
    assert would["dry_run"] and would["bytes"] == {"segments": sum(before[i] for i in range(4)), "environments": 0}
    assert segments(job_id) == before  # a dry run removes nothing
    [attempt] = json.loads(cli("status", job_id, "--json").output)["attempts"]
    assert [(i["kind"], i["where"], i["count"]) for i in would["items"]] == [("segments", attempt["id"], 4)]
    text = cli("gc", "--dry-run")
    [line] = [line for line in text.output.splitlines() if line.startswith("segments ")]
    assert text.exit_code == 0 and line.split() == ["segments", "would", "free",
                                                     f"{sum(before[i] for i in range(4)) / 1e6:.1f}", "MB", "(4", "directories)"]

    freed = gc()
    assert freed["bytes"] == would["bytes"] and freed["total_bytes"] == would["total_bytes"] > 0
    assert segments(job_id) == {4: before[4]}  # S_n: the state to continue training from
    outputs = paths.job_dir(job_id) / "outputs"
    assert (outputs / "model.safetensors").is_file() and (outputs / "commitment.json").is_file()
    assert (outputs / "metrics.jsonl").is_file() and (paths.attempt_dir(job_id, 1) / "job.log").is_file()
    assert gc()["total_bytes"] == 0  # nothing left to give
    assert json.loads(cli("status", job_id, "--json").output)["state"] == "accepted"


@pytest.mark.slow
def test_an_audited_run_keeps_the_segments_its_audit_opened_once_accepted(tm_home, tmp_path):
    (tmp_path / "job.yaml").write_text(AUDITED_DQN)
    job_id = accepted(tmp_path / "job.yaml")  # the default policy: drop at acceptance
    verdict = json.loads((paths.job_dir(job_id) / "verdict.json").read_text())
    challenged = verdict["evidence"]["replay"]["challenge"]["segments"]
    assert len(challenged) == 6
    assert set(segments(job_id)) == {12} | {j for i in challenged for j in (i, i + 1)}
    events = json.loads(cli("status", job_id, "--json").output)["events"]
    [disk] = [e for e in events if e["kind"] == "disk"]
    assert disk["detail"]["reason"].startswith("gave back segments ")


def fake_env(envs, name: str, size: int, last_used: float, ready: bool = True):
    venv = envs / name
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "blob").write_bytes(b"x" * size)
    if ready:
        (venv / ".ready").touch()
        os.utime(venv / ".ready", (last_used, last_used))
    return venv


def test_gc_keeps_environments_by_least_recent_use_within_the_cap_and_never_one_in_use(tm_home):
    envs = tm_home / "envs"
    now = time.time()
    newest = fake_env(envs, "a" * 16, 4000, now - 10)
    middle = fake_env(envs, "b" * 16, 4000, now - 100)
    oldest_in_use = fake_env(envs, "c" * 16, 4000, now - 1000)
    oldest = fake_env(envs, "d" * 16, 4000, now - 500)
    failed = fake_env(envs, "e" * 16, 1000, now, ready=False)
    retention(f"envs_max_gb: {9000 / 2**30}\n")  # room for two of them
    with open(envs / f".{oldest_in_use.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # as a running job's supervisor holds it
        would = gc("--dry-run")
        assert would["bytes"] == {"segments": 0, "environments": 9000}
        assert [i["where"] for i in would["items"]] == [str(failed), str(middle), str(oldest)]
        assert all(p.exists() for p in (newest, middle, oldest, failed))
        freed = gc()
        assert freed["bytes"]["environments"] == 9000
    assert newest.exists() and oldest_in_use.exists()  # the in-use one counts first; the newest fits beside it
    assert not middle.exists() and not oldest.exists() and not failed.exists()
    assert gc()["total_bytes"] == 0


def test_an_invalid_retention_file_is_named_with_its_line(tm_home):
    retention("drop_accepted_segments: true\nenvs_max_gigs: 3\n")
    result = cli("gc")
    assert result.exit_code == 1
    assert "retention.yaml:2: envs_max_gigs" in result.output


@pytest.mark.slow
def test_an_environment_a_running_job_uses_is_kept_then_given_back(tm_home, job_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the requirement is already in the base environment: no network
    go = tmp_path / "go"
    script = f"""
        import os, pathlib, sys, time
        out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
        (out / ".venv.tmp").write_text(sys.prefix)
        os.rename(out / ".venv.tmp", out / "venv.txt")
        while not pathlib.Path({str(go)!r}).exists():
            time.sleep(0.05)
    """
    spec = job_factory(script, "environment:\n  python: requirements\n")
    (spec.parent / "requirements.txt").write_text("pyyaml\n")
    retention("envs_max_gb: 0\n")  # no environment is worth keeping once unused
    out = cli("submit", spec, "--json")
    assert out.exit_code == 0, out.output
    job_id = json.loads(out.output)["id"]
    running = paths.attempt_dir(job_id, 1) / "outputs" / "venv.txt"  # the job runs, in its environment
    deadline = time.time() + 240
    while not running.exists():
        assert time.time() < deadline, (paths.attempt_dir(job_id, 1) / "job.log").read_text()
        time.sleep(0.1)
    venv = Path(running.read_text())
    assert venv.parent == paths.home() / "envs"
    assert gc()["bytes"]["environments"] == 0 and (venv / ".ready").is_file()  # in use: kept
    go.touch()
    deadline = time.time() + 120
    while venv.exists():  # given back at acceptance, or by gc once the supervisor has let go of it
        assert time.time() < deadline, "the environment was never given back"
        gc()
        time.sleep(0.1)
    shown = polled(lambda: json.loads(cli("status", job_id, "--json").output),  # the background pass ends it
                   lambda job: job["state"] in ("accepted", "failed"))
    assert shown["state"] == "accepted", shown


def test_an_invalid_retention_file_never_fails_an_accepted_job(tm_home, job_factory):
    retention("envs_max_gb: -1\n")
    spec = job_factory("import os, pathlib\n"
                       "(pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR']) / 'done.txt').write_text('ok')\n")
    job_id = accepted(spec)
    events = json.loads(cli("status", job_id, "--json").output)["events"]
    [error] = [e for e in events if e["kind"] == "error"]
    assert error["detail"]["message"].startswith("giving disk back: ") and "retention.yaml:1: envs_max_gb" in error["detail"]["message"]


def local_segments(workdir: Path, sizes: dict[str, int]) -> Path:
    """A local backend's work dir whose `checkpoints/segments/` holds an entry per name, of `size` bytes."""
    base = workdir / "checkpoints" / "segments"
    for name, size in sizes.items():
        (base / name).mkdir(parents=True)
        (base / name / "state.bin").write_bytes(b"s" * size)
    return base


def test_the_local_backend_releases_every_segment_but_the_kept_ones_once(tmp_path):
    workdir = tmp_path / "attempt"
    base = local_segments(workdir, {"00000000": 100, "00000001": 200, "00000002": 300, "00000003.tmp": 50})
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"p" * 1000)
    (base / "00000004").symlink_to(outside, target_is_directory=True)  # a job's link: removed as a link, never followed
    backend, handle = LocalBackend(), Handle(backend="local", attempt_id="a1", data={"workdir": str(workdir)})

    held = asyncio.run(backend.segments_held(handle))
    assert [(s.index, s.bytes) for s in held] == [(0, 100), (1, 200), (2, 300), (None, 50),
                                                  (4, len(os.readlink(base / "00000004")))]
    freed = asyncio.run(backend.release_segments(handle, {2, 7}))
    assert freed == 100 + 200 + 50 + len(str(outside))
    assert sorted(p.name for p in base.iterdir()) == ["00000002"]  # the kept one; the half-written one went too
    assert (outside / "precious").is_file()
    assert asyncio.run(backend.release_segments(handle, {2})) == 0  # idempotent
    assert [(s.index, s.bytes) for s in asyncio.run(backend.segments_held(handle))] == [(2, 300)]


def test_the_local_backend_never_follows_a_linked_segments_folder(tmp_path):
    outside = local_segments(tmp_path / "elsewhere", {"00000000": 100})
    workdir = tmp_path / "attempt"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "checkpoints" / "segments").symlink_to(outside, target_is_directory=True)
    backend, handle = LocalBackend(), Handle(backend="local", attempt_id="a1", data={"workdir": str(workdir)})
    assert asyncio.run(backend.segments_held(handle)) == []
    assert asyncio.run(backend.release_segments(handle, set())) == 0
    assert (outside / "00000000" / "state.bin").is_file()


def test_a_backend_that_cannot_release_segments_has_nothing_reclaimed(tm_home, job_factory):
    from broker_support import SyncBroker
    from scripted_backend import Script, Scripted
    from trainmaster.backends.features import ReleasesSegments
    from trainmaster.broker.filekeeping import reclaim
    from trainmaster.broker.filekeeping.retention import Retention
    from trainmaster.broker.service import Broker

    assert not isinstance(Scripted(), ReleasesSegments)
    broker = SyncBroker(Broker(backends={"local": Scripted(name="local", script=Script())}))
    try:
        job = broker.submit(job_factory("print('hi')\n"))
        job = broker.wait(job.id, timeout_s=60)
        assert job.state == "accepted"  # given back at acceptance: no error for the backend that cannot
        assert not [e for e in broker.store.events(job.id) if e.kind == "error"]
        # what lies where the local backend would keep segments is not the broker's to open
        stray = local_segments(paths.attempt_dir(job.id, 1), {"00000000": 100, "00000001": 100})
        assert asyncio.run(reclaim.job_segments(broker.store, job.id, broker.backend_of)) == []
        found = asyncio.run(reclaim.reclaimable(broker.store, Retention(), tm_home / "envs", broker.backend_of))
        assert [i for i in found if i.kind == "segments"] == []
        assert sorted(p.name for p in stray.iterdir()) == ["00000000", "00000001"]
    finally:
        broker.close()


BROKER = ROOT / "broker"
CREATES_THE_FOLDER = {
    ("paths.py", "attempt_dir"),  # its definition
    ("stages/dispatch.py", "attempt_context"),  # makes the attempt's work dir and hands it to the backend (AttemptContext.workdir)
}


def test_the_broker_names_an_attempts_folder_only_to_create_it_for_its_backend():
    """`attempt_dir(` in broker/ (a grep, each hit named by the innermost function around it) only where the
    folder is made for a backend, never where a backend's scratch folder would be read, walked or deleted."""
    found = set()
    for path in sorted(BROKER.rglob("*.py")):
        text = path.read_text()
        functions = [f for f in ast.walk(ast.parse(text)) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for line_no, line in enumerate(text.splitlines(), 1):
            if "attempt_dir(" not in line:
                continue
            around = [f for f in functions if f.lineno <= line_no <= f.end_lineno]
            innermost = max(around, key=lambda f: f.lineno).name if around else "<module>"
            found.add((str(path.relative_to(BROKER)), innermost))
    assert found == CREATES_THE_FOLDER

"""The local machine as a resource, through the CLI: concurrent `submit`s (subprocesses) on an inventory
set in backends.yaml run one at a time when they do not fit together, never share a GPU, and every
queued job runs; `ls`/`status` show a queued job's place, and `--dry-run` says whether it would start now."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import combinations

# each job records its own start and end, and which GPUs it sees, in its outputs
TRAIN = """\
import json, os, pathlib, time
start = time.time()
time.sleep(1.0)
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "ran.json").write_text(json.dumps(
    {"start": start, "end": time.time(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}))
"""


def tm(*args: str, home) -> subprocess.Popen:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def run(*args: str, home) -> subprocess.CompletedProcess:
    proc = tm(*args, home=home)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def inventory(home, text: str) -> None:
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "backends.yaml").write_text(text)


def submit_at_once(spec, home, n: int) -> list[dict]:
    """`n` concurrent `submit --wait --json` of the same spec; each job's status as it ended."""
    procs = [tm("submit", str(spec), "--wait", "--json", home=home) for _ in range(n)]
    done = [p.communicate(timeout=600) for p in procs]
    for proc, (out, err) in zip(procs, done):
        assert proc.returncode == 0, err
    return [json.loads(out) for out, _ in done]


def ran(home, job: dict) -> dict:
    return json.loads((home / "jobs" / job["id"] / "outputs" / "ran.json").read_text())


def overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_three_jobs_asking_for_both_cpus_run_one_at_a_time_and_all_run(job_factory, tmp_path):
    home = tmp_path / "home"
    inventory(home, "local:\n  cpus: 2\n")
    spec = job_factory(TRAIN, "estimated_hours: 0.001\nresources:\n  cpus: 2\n")
    jobs = submit_at_once(spec, home, 3)
    assert [j["state"] for j in jobs] == ["accepted"] * 3
    runs = [ran(home, j) for j in jobs]
    assert not [pair for pair in combinations(runs, 2) if overlap(*pair)]
    events = [e for j in jobs for e in json.loads(run("status", j["id"], "--json", home=home).stdout)["events"]]
    assert any(e["to"] == "queued" for e in events)  # at least one of them waited its turn


def test_no_two_jobs_ever_hold_the_same_gpu_of_a_fake_two_gpu_inventory(job_factory, tmp_path):
    home = tmp_path / "home"
    inventory(home, "local:\n  cpus: 8\n  gpus:\n    - {name: A100, memory_gb: 80}\n    - {name: A100, memory_gb: 80}\n")
    spec = job_factory(TRAIN, "estimated_hours: 0.001\nresources:\n  gpus: 1\n")
    jobs = submit_at_once(spec, home, 4)
    assert [j["state"] for j in jobs] == ["accepted"] * 4
    runs = [ran(home, j) for j in jobs]
    assert sorted({r["gpus"] for r in runs}) == ["0", "1"]  # each job sees exactly its own GPU
    for a, b in combinations(runs, 2):
        assert not (overlap(a, b) and a["gpus"] == b["gpus"]), (a, b)


def test_ls_and_status_show_a_queued_jobs_place_and_dry_run_says_it_would_wait(job_factory, tmp_path):
    home = tmp_path / "home"
    inventory(home, "local:\n  cpus: 1\n")
    holder = job_factory("import time\ntime.sleep(600)\n", "estimated_hours: 0.001\noutputs:\n  optional: true\n")
    waiting = job_factory(TRAIN, "estimated_hours: 0.001\n")
    dry = json.loads(run("submit", str(waiting), "--dry-run", "--json", home=home).stdout)
    assert dry["start"] == "would start now"
    first = json.loads(run("submit", str(holder), "--json", home=home).stdout)
    assert first["state"] in ("dispatched", "running")
    dry = run("submit", str(waiting), "--dry-run", home=home)
    assert "start: would wait in the queue: 1 CPU(s) asked, 0 of 1 free" in dry.stdout
    second = json.loads(run("submit", str(waiting), "--json", home=home).stdout)
    third = json.loads(run("submit", str(waiting), "--json", home=home).stdout)
    assert (second["state"], second["queue_position"]) == ("queued", 1)
    assert (third["state"], third["queue_position"]) == ("queued", 2)
    listed = run("ls", home=home).stdout
    assert "queued #1" in listed and "queued #2" in listed
    assert f"{third['id']}  queued #2" in run("status", third["id"], home=home).stdout
    assert json.loads(run("cancel", first["id"], "--json", home=home).stdout)["state"] == "cancelled"
    for job in (second, third):
        assert run("logs", "-f", job["id"], home=home).returncode == 0  # follows it until it ends
    states = {j["id"]: j["state"] for j in json.loads(run("ls", "--all", "--json", home=home).stdout)}
    assert (states[second["id"]], states[third["id"]]) == ("accepted", "accepted")
    assert ran(home, second)["end"] <= ran(home, third)["start"]  # in order, one at a time

"""Start-up of the commands people type, median of N, each as a ratio to (and seconds over) `python -c pass`,
in wall-clock and in CPU time (user + system; steadier when other work shares the machine).

`--help`, `submit --help`, `submit --dry-run` of a small job, and the read-only `ls --all` and `status ID` on a
home of 60 ended jobs: one run for real (a one-line script), the other 59 written through the Store as copies of
its rows (plan, attempt, states, cost). Target: every read-only command ≤ 0.10 s over a bare interpreter
(for comparison: `sky --help` ≈ 1.35 s and `dstack --help` ≈ 0.77 s on a 2-core machine).
Run: python tests/benchmarks/bench_cli.py
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

ENDED_JOBS = 60
TARGET_OVER_BARE_S = 0.10


def trainmaster_command() -> list[str]:
    script = Path(sys.executable).parent / "trainmaster"
    found = str(script) if script.exists() else shutil.which("trainmaster")
    return [found] if found else [sys.executable, "-m", "trainmaster.broker.cli"]


def _job(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.py").write_text("import os, pathlib\n"
                                   "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'result.json').write_text('{}')\n")
    (root / "job.yaml").write_text("name: tiny\nentrypoint: python train.py\n")
    return root / "job.yaml"


def ended_jobs_home(home: Path, spec: Path, n: int) -> str:
    """Fill ``home`` with ``n`` ended jobs; returns the id of the one that ran."""
    env = {**os.environ, "TRAINMASTER_HOME": str(home)}
    subprocess.run([*trainmaster_command(), "submit", str(spec), "--wait"], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from trainmaster.broker.store import Store

    store = Store(home.absolute() / "state.db")  # paths.state_db() under TRAINMASTER_HOME=home
    try:
        [job] = store.jobs(limit=1)
        for i in range(n - 1):
            _copy(store, job, f"{job.id}-{i:02d}")
    finally:
        store.close()
    return job.id


def _copy(store, job, job_id: str) -> None:
    """A copy of ``job`` and its one attempt, moved through the same states by the Store."""
    [attempt] = store.attempts(job.id)
    store.create_job(job_id=job_id, name=job.name, workload=job.workload, project=job.project, spec_json=job.spec_json,
                     spec_path=job.spec_path, bundle_sha256=job.bundle_sha256, policy=job.policy,
                     policy_json=job.policy_json)
    store.set_plan(job_id, job.plan_json, detail={})
    copy = store.create_attempt(job_id, backend=attempt.backend, offer_json=attempt.offer_json,
                                reserve_key=f"reserve:{job_id}.1", seed=attempt.seed)
    for state in ("running", "returned", "verifying", "accepted"):
        store.move_attempt(copy.id, state, job_target=state, started_at=attempt.started_at, ended_at=attempt.ended_at)
    store.record_cost(copy.id, micro_usd=attempt.cost_micro_usd or 0, rao=0, billable_seconds=1.0, basis="copy")


def commands(job_id: str, spec: Path) -> dict[str, list[str]]:
    return {
        "--help": ["--help"],
        "submit --help": ["submit", "--help"],
        "submit --dry-run": ["submit", str(spec), "--dry-run"],
        "ls --all": ["ls", "--all"],
        "status ID": ["status", job_id],
    }


def run(smoke: bool = False) -> dict[str, float]:
    repeat = 2 if smoke else 10
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        spec = _job(Path(tmp) / "job")
        job_id = ended_jobs_home(Path(tmp) / "home", spec, 3 if smoke else ENDED_JOBS)
        env = {**os.environ, "TRAINMASTER_HOME": str(Path(tmp) / "home"), "COLUMNS": "120"}
        bare = [sys.executable, "-c", "pass"]
        figures: dict[str, float] = {}
        for name, args in commands(job_id, spec).items():
            runs = [(_timed([*trainmaster_command(), *args], env), _timed(bare, env)) for _ in range(repeat)]
            for i, what in enumerate(("wall", "cpu")):
                command_s = statistics.median(c[i] for c, _ in runs)
                bare_s = statistics.median(b[i] for _, b in runs)
                figures[f"{name} {what} (s)"] = command_s
                figures[f"{name} {what} over bare (s)"] = command_s - bare_s
                figures[f"{name} {what} / bare"] = command_s / bare_s
        figures["python -c pass wall (s)"], figures["python -c pass cpu (s)"] = _timed(bare, env)
    return figures


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run; each command is paired with a bare interpreter
    run right after it, so both see the same machine load. CPU time is the steadier figure on a shared machine."""
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


if __name__ == "__main__":
    figures = run()
    targets = {key: f"≤ {TARGET_OVER_BARE_S:.2f}" for key in figures if key.endswith("over bare (s)")}
    print_figures(f"CLI start-up, median of 10, {ENDED_JOBS} ended jobs in the home", figures, targets)

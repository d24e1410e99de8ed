"""`trainmaster submit --wait` CLIs killed with kill -9 at seeded random moments, one after another on one home, then
the jobs brought to their ends by later commands and the state database read for what a crash doubled, lost or
blamed on a job.

Shared by `tests/broker/cli/test_cli_chaos.py` (a few kills) and `tests/benchmarks/bench_cli_chaos.py` (100 kills).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos_support import _charge_problems

ENDS = ("accepted", "failed", "cancelled")
JOB = ("import os, pathlib, time\ntime.sleep(0.3)\n"
       "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")


@dataclass
class Outcome:
    kills: int
    jobs: dict[str, str]
    """Each recorded job's state, once every one has ended."""
    reasons: dict[str, str]
    """The reason of each job that did not end accepted."""
    duplicate_charges: int
    open_reservations: int
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    window: tuple[float, float] = (0.1, 4.0)
    """The kill window used (seconds after the CLI started)."""

    @property
    def accepted(self) -> int:
        return sum(s == "accepted" for s in self.jobs.values())


def scene(code: Path) -> Path:
    code.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text(JOB)
    (code / "job.yaml").write_text("name: chaos-cli\nentrypoint: python train.py\nestimated_hours: 0.001\n")
    return code / "job.yaml"


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}


def tm(home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=_env(home), timeout=timeout)


def run_chaos(home: Path, code: Path, *, kills: int, seed: int, low_s: float = 0.1, high_s: float = 4.0,
              settle_s: float = 240.0, scaled: bool = False) -> Outcome:
    """Start `submit --wait` and kill -9 it after a seeded random 0.1–4 s, `kills` times (a CLI that ended first is
    not killed); then run `ls` until every recorded job has ended, and read the outcome.

    `scaled`: on a machine slower than the one the window was set on (a whole `submit --wait` of the job takes
    about 4 s there), the window is stretched by how much longer one whole run takes here, measured first (that
    run's job is recorded and counted like the others), so the kills still fall across a submit's whole life."""
    spec, rng, began = scene(code), random.Random(seed), time.monotonic()
    stretch = 1.0
    if scaled:
        whole = time.monotonic()
        tm(home, "submit", str(spec), "--wait", "--json")
        stretch = max(1.0, (time.monotonic() - whole) / high_s)
        low_s, high_s = low_s * stretch, high_s * stretch
    for _ in range(kills):
        cli = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--wait", "--json"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(home))
        try:
            cli.wait(timeout=rng.uniform(low_s, high_s))
        except subprocess.TimeoutExpired:
            os.kill(cli.pid, signal.SIGKILL)
            cli.wait()
    deadline = time.monotonic() + settle_s
    while True:
        listed = tm(home, "ls", "--all", "--limit", "0", "--json")
        states = {j["id"]: j["state"] for j in json.loads(listed.stdout or "[]")}
        if all(s in ENDS for s in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    outcome = read_outcome(home / "state.db", kills)
    outcome.seconds, outcome.window = time.monotonic() - began, (low_s, high_s)
    return outcome


def read_outcome(db_path: Path, kills: int) -> Outcome:
    db = sqlite3.connect(db_path, timeout=30)
    db.row_factory = sqlite3.Row
    try:
        rows = db.execute("SELECT id, state, reason FROM jobs").fetchall() if _has(db, "jobs") else []
        jobs = {r["id"]: r["state"] for r in rows}
        reasons = {r["id"]: r["reason"] or "" for r in rows if r["state"] != "accepted"}
        charge_problems = _charge_problems(db) if _has(db, "ledger_entries") else []
        open_reservations = db.execute(
            "SELECT r.key, j.state FROM ledger_entries r JOIN jobs j ON j.id = r.job_id WHERE r.kind = 'reserve'"
            " AND NOT EXISTS (SELECT 1 FROM ledger_entries s WHERE s.reservation_key = r.key)").fetchall() \
            if _has(db, "ledger_entries") else []
    finally:
        db.close()
    problems = [f"job {j} ended {s}: {reasons.get(j, '')}" for j, s in jobs.items() if s != "accepted"]
    problems += charge_problems
    problems += [f"reservation {r['key']} still open (its job is {r['state']})" for r in open_reservations]
    return Outcome(kills=kills, jobs=jobs, reasons=reasons, duplicate_charges=len(charge_problems),
                   open_reservations=len(open_reservations), problems=problems)


def _has(db: sqlite3.Connection, table: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None

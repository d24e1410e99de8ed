"""The daemon under kill -9: a folder trigger fed with new files while the daemon is killed at seeded random moments
and started again, then the state database read for what a crash may have doubled or lost.

Shared by `tests/broker/daemon/test_daemon_chaos.py` (10 kills) and `tests/benchmarks/bench_daemon_chaos.py` (100 kills).
"""

from __future__ import annotations

import json
import random
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from daemon_support import kill, start, wait_for

from trainmaster.storage.dialects import sqlite as sqlite_dialect

ENDS = ("accepted", "failed", "cancelled")
JOB = ("import os, pathlib, time\ntime.sleep(0.3)\n"
       "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")


@dataclass
class Outcome:
    """What the state database says after the chaos settled."""

    kills: int
    files: int
    fires: int
    jobs: dict[str, str]
    """Each triggered job's state."""
    problems: list[str] = field(default_factory=list)
    """Every duplicate or loss found (empty when the daemon kept its promises)."""
    seconds: float = 0.0


def scene(home: Path, code: Path) -> Path:
    """The tiny job and a `folder` trigger on `<code>/incoming` (min_new 1, no debounce); returns the folder."""
    code.mkdir(parents=True, exist_ok=True)
    (code / "train.py").write_text(JOB)
    (code / "job.yaml").write_text("name: chaos\nentrypoint: python train.py\n")
    incoming = code / "incoming"
    incoming.mkdir()
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "triggers.yaml").write_text(
        f"triggers:\n  - name: feed\n    spec: {code / 'job.yaml'}\n"
        f"    data: {{folder: {incoming}, min_new: 1}}\n    debounce_s: 0\n")
    return incoming


def run_chaos(home: Path, code: Path, *, kills: int, seed: int, settle_s: float = 60.0) -> Outcome:
    """Feed files and kill -9 the daemon `kills` times (seeded random moments), let it settle, read the outcome."""
    incoming, rng, began = scene(home, code), random.Random(seed), time.monotonic()
    daemon, files = start(home), 0
    try:
        for _ in range(kills):
            for _ in range(rng.randint(0, 2)):
                files += 1
                (incoming / f"batch-{files:04d}.txt").write_text(str(files))
            time.sleep(rng.uniform(0.2, 3.0))
            kill(daemon["pid"])
            daemon = start(home)
        wait_for(lambda: _settled(home, files), timeout=settle_s, what="every file served and every job ended")
    finally:
        kill(daemon["pid"], sig=15)
    outcome = read_outcome(home / "state.db", files)
    outcome.kills, outcome.seconds = kills, time.monotonic() - began
    return outcome


def _settled(home: Path, files: int) -> bool:
    """The last fire saw every file fed and every fire's job has ended."""
    db = _open(home / "state.db")
    try:
        fires = db.execute("SELECT f.cursor_json, f.job_id, j.state FROM trigger_fires f"
                           " LEFT JOIN jobs j ON j.id = f.job_id ORDER BY f.id").fetchall()
    except sqlite3.OperationalError:
        return False  # the tables are not made yet
    finally:
        db.close()
    if not fires:
        return files == 0
    last_names = json.loads(fires[-1]["cursor_json"])["names"]
    return len(last_names) == files and all(f["state"] in ENDS for f in fires)


def read_outcome(db_path: Path, files: int) -> Outcome:
    """The fires, jobs, charges and leases in the state database, and every duplicate or loss among them."""
    db = _open(db_path)
    try:
        fires = db.execute("SELECT * FROM trigger_fires ORDER BY id").fetchall()
        jobs = dict(db.execute("SELECT id, state FROM jobs").fetchall())
        outcome = Outcome(kills=0, files=files, fires=len(fires), jobs=jobs)
        outcome.problems += _fire_problems(fires, jobs, files)
        outcome.problems += _charge_problems(db)
        outcome.problems += [f"lease on {job} left held by {holder}" for job, holder in db.execute(
            f"SELECT job_id, holder FROM job_leases WHERE expires_at > {sqlite_dialect.NOW}")]
    finally:
        db.close()
    return outcome


def _fire_problems(fires: list, jobs: dict[str, str], files: int) -> list[str]:
    """One job per fire, every job from a fire and ended accepted, each file counted as new by exactly one fire."""
    problems = [f"fire {f['id']} ended without a job: {f['error']}" for f in fires if f["job_id"] is None]
    fired_jobs = [f["job_id"] for f in fires if f["job_id"]]
    problems += [f"job {j} made for two fires" for j in set(fired_jobs) if fired_jobs.count(j) > 1]
    problems += [f"job {j} made by no fire" for j in jobs if j not in fired_jobs]
    problems += [f"job {j} ended {jobs.get(j)}" for j in fired_jobs if jobs.get(j) != "accepted"]
    served: list[str] = []
    seen: set[str] = set()
    for fire in fires:
        names = set(json.loads(fire["cursor_json"])["names"])
        served += sorted(names - seen)
        seen = names
    problems += [f"file {n} served by two fires" for n in set(served) if served.count(n) > 1]
    if len(seen) != files:
        problems.append(f"{files} files fed, {len(seen)} seen by the fires")
    return problems


def _charge_problems(db: sqlite3.Connection) -> list[str]:
    """Each attempt charged at most once, and each accepted attempt exactly once."""
    charged = dict(db.execute(
        "SELECT a.id, count(e.seq) FROM attempts a LEFT JOIN ledger_entries e"
        " ON e.kind = 'charge' AND e.reservation_key = a.reserve_key GROUP BY a.id").fetchall())
    accepted = {a for (a,) in db.execute("SELECT id FROM attempts WHERE state = 'accepted'")}
    problems = [f"attempt {a} charged {n} times" for a, n in charged.items() if n > 1]
    problems += [f"accepted attempt {a} charged {charged.get(a, 0)} times" for a in accepted if charged.get(a) != 1]
    charges_by_job = db.execute("SELECT job_id, count(*) FROM ledger_entries WHERE kind = 'charge' GROUP BY job_id")
    attempts_by_job = dict(db.execute("SELECT job_id, count(*) FROM attempts GROUP BY job_id").fetchall())
    problems += [f"job {j} has {n} charges for {attempts_by_job.get(j, 0)} attempts"
                 for j, n in charges_by_job if n > attempts_by_job.get(j, 0)]
    return problems


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30)
    db.row_factory = sqlite3.Row
    return db

"""A state database with known jobs, ledger rows and verdicts, made through the store's, the ledger's and the
verdict records' own APIs, for the `/metrics` and dashboard tests; and the web routes served on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from served_app import ServedApp
from trainmaster.broker.daemon.web import add_routes
from trainmaster.broker.store import Store
from trainmaster.verify.records import VerdictStore
from trainmaster.verify.verdict import Verdict
from trainmaster.wallet.budget import Budget
from trainmaster.wallet.ledger import Ledger

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


class Filler:
    """Jobs walked through their states as the broker walks them; money through the ledger."""

    def __init__(self, home: Path, where: Path | str | None = None):
        self.home = home
        self.path = where or home / "state.db"
        self.store = Store(self.path)
        self.ledger = Ledger(self.store.db)
        self.verdicts = VerdictStore(self.path)

    def close(self) -> None:
        self.verdicts.close()
        self.store.close()

    def submit(self, job_id: str, name: str = "train") -> None:
        self.store.create_job(job_id=job_id, name=name, workload="development", project=None, spec_json="{}",
                              spec_path="/x/job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")
        self.store.set_plan(job_id, "{}", detail={})

    def dispatch(self, job_id: str, backend: str, reserve_usd: int) -> str:
        """The job's first attempt dispatched on `backend`, its reservation held; the attempt's id."""
        key = f"reserve:{job_id}.1"
        self.ledger.reserve(key, job_id=job_id, backend=backend, workload="development", micro_usd=reserve_usd)
        attempt = self.store.create_attempt(job_id, backend=backend, offer_json="{}", reserve_key=key, seed=1)
        self.store.set_handle(attempt.id, json.dumps({"backend": backend, "attempt_id": attempt.id, "data": {}}))
        self.store.move_attempt(attempt.id, "running", job_target="running")
        return attempt.id

    def cancel_before_it_ran(self, job_id: str, backend: str) -> None:
        """Planned on `backend`, its attempt made, and cancelled before the backend started anything (no handle)."""
        key = f"reserve:{job_id}.1"
        self.ledger.reserve(key, job_id=job_id, backend=backend, workload="development", micro_usd=1_000)
        attempt = self.store.create_attempt(job_id, backend=backend, offer_json="{}", reserve_key=key, seed=1)
        self.ledger.release(f"release:{key}", reservation_key=key)
        self.store.move_attempt(attempt.id, "cancelled", job_target="cancelled", reason="cancelled by the user")

    def accept(self, job_id: str, attempt_id: str, micro_usd: int, rao: int = 0) -> None:
        """Returned, verified, accepted and charged `micro_usd` (and `rao`)."""
        self.store.move_attempt(attempt_id, "returned", job_target="returned")
        self.store.move_attempt(attempt_id, "verifying", job_target="verifying")
        self.ledger.charge(f"charge:{attempt_id}", reservation_key=f"reserve:{attempt_id}", micro_usd=micro_usd,
                           rao=rao, rate_micro_usd_per_tao=400_000_000 if rao else None)
        self.store.record_cost(attempt_id, micro_usd=micro_usd, rao=rao, billable_seconds=60.0, basis="test")
        self.record_verdict(job_id, attempt_id, Verdict(outcome="accepted", checks=["outputs", "replay"],
                                                        evidence={"replayed_steps": 3}))
        self.store.move_attempt(attempt_id, "accepted", job_target="accepted")

    def reject(self, job_id: str, attempt_id: str, reason: str) -> None:
        """Returned, rejected for `reason` (executor text), its reservation released; the job fails."""
        self.store.move_attempt(attempt_id, "returned", job_target="returned")
        self.ledger.release(f"release:{attempt_id}", reservation_key=f"reserve:{attempt_id}")
        self.record_verdict(job_id, attempt_id, Verdict(outcome="rejected", reasons=[reason], checks=["replay"],
                                                        evidence={"note": reason}))
        self.store.move_attempt(attempt_id, "rejected", job_target="failed", reason=reason)

    def record_verdict(self, job_id: str, attempt_id: str, verdict: Verdict) -> None:
        self.verdicts.record(verdict, job_id=job_id, attempt_id=attempt_id)

    def write_metrics(self, job_id: str, lines: list[dict | str]) -> None:
        """The job's fetched `metrics.jsonl` (where the broker puts what it fetched)."""
        folder = self.home / "jobs" / job_id / "outputs"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.jsonl").write_text(
            "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


def known_state(home: Path, where: Path | str | None = None) -> Filler:
    """Four jobs: `a` accepted on local ($1.50), `b` accepted on bittensor ($0.25 + 5,000 rao), `c` rejected
    (its reservation released) with a hostile reason and name, `d` running on aws ($2 held); `e` submitted.
    In `home/state.db`, or at `where` (a database server's URL)."""
    filler = Filler(home, where)
    for job_id in ("a", "b", "c", "d", "e"):
        filler.submit(job_id, name=HOSTILE if job_id == "c" else f"train-{job_id}")
    filler.accept("a", filler.dispatch("a", "local", 2_000_000), 1_500_000)
    filler.accept("b", filler.dispatch("b", "bittensor", 500_000), 250_000, rao=5_000)
    filler.reject("c", filler.dispatch("c", "local", 1_000_000), HOSTILE)
    filler.dispatch("d", "aws", 2_000_000)
    filler.write_metrics("a", [{"step": s, "loss": 2.0 / s, "lr": 0.1} for s in range(1, 51)])
    return filler


def serve(store_path: Path, budgets: list[Budget] = (), lag_source=None) -> ServedApp:
    app = web.Application()
    add_routes(app, store_path, budgets=lambda: budgets, lag_source=lag_source)
    return ServedApp(app)

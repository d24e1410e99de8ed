"""Money limits that limit: `limits.max_usd` stops a running job at the cap with the reason, what it
spent is charged, and the runtime estimate comes from the job's own spec or history, saying from where."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainmaster.backends.local.backend import LocalBackend
from trainmaster.broker.money import cost_cap
from trainmaster.broker.planning.estimate import PastRun, own_estimate
from trainmaster.jobs.spec import JobSpec

LONG = "import time\ntime.sleep(600)\n"
CAP = "estimated_hours: 0.001\nlimits:\n  max_usd: 0.00008\noutputs:\n  optional: true\n"


def tm(*args: str, home) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_long_job_with_a_tiny_max_usd_is_stopped_at_the_cap_and_charged(job_factory, tmp_path):
    home = tmp_path / "home"
    out = tm("submit", str(job_factory(LONG, CAP)), "--wait", "--json", home=home)
    assert out.returncode == 1, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "failed"
    assert job["reason"].startswith("stopped at the cost cap limits.max_usd = $0.00008 (spent $")
    [attempt] = job["attempts"]
    assert attempt["state"] == "failed" and attempt["reason"] == job["reason"]
    assert attempt["cost_micro_usd"] >= 80  # it ran up to the cap, and what it spent is recorded
    charged = json.loads(tm("spend", "--by", "job", "--json", home=home).stdout)
    assert charged == [{"group": job["id"], "usd": f"{attempt['cost_micro_usd'] / 1e6:f}".rstrip("0"),
                        "micro_usd": attempt["cost_micro_usd"], "rao": 0, "charges": 1,
                        "unsent_payments": 0, "unsent_rao": 0}]
    assert "stopped at the cost cap" in tm("status", job["id"], home=home).stdout


class _NoBackstop(LocalBackend):
    """The local backend without its own time limit at the cap: only the broker's watch can stop it."""

    def _launch(self, spec, offer, ctx, workdir):
        return super()._launch(spec, offer, ctx.model_copy(update={"max_micro_usd": None}), workdir)


def test_the_brokers_watch_stops_a_running_attempt_at_the_cap(tm_home, job_factory):
    from broker_support import sync_broker

    from trainmaster.wallet.ledger import Ledger

    broker = sync_broker(backends={"local": _NoBackstop()})
    try:
        job = broker.wait(broker.submit(job_factory(LONG, CAP)).id, timeout_s=120)
        assert job.state == "failed" and job.reason.startswith("stopped at the cost cap limits.max_usd = $0.00008")
        [attempt] = broker.store.attempts(job.id)
        launch = json.loads((tm_home / "jobs" / job.id / "attempts" / "1" / "launch.json").read_text())
        assert launch["max_seconds"] is None  # so it was the broker that stopped it
        assert attempt.state == "failed" and attempt.cost_micro_usd >= 80
        charges = [e for e in Ledger(broker.store.db).entries(job_id=job.id) if e.kind == "charge"]
        assert [c.micro_usd for c in charges] == [attempt.cost_micro_usd]
    finally:
        broker.close()


def test_the_supervisors_time_limit_is_what_the_remaining_cap_buys():
    from trainmaster.backends.base import AttemptContext, Offer
    from trainmaster.backends.time_limit import max_seconds

    offer = Offer(backend="local", instance="h", region="local", gpu_count=0, cpus=1, memory_mb=1, trusted=True,
                  price_per_hour_micro_usd=18_000)
    ctx = AttemptContext(job_id="j", attempt_id="j.1", bundle_sha256="0" * 64, seed=0, workdir="/x", max_micro_usd=80)
    spec = JobSpec(name="t", entrypoint="python t.py", limits={"max_hours": 1})
    assert max_seconds(spec, offer, ctx) == 16  # 80 µUSD at 18,000 µUSD/h: 16 s, sooner than max_hours
    assert max_seconds(spec, offer, ctx.model_copy(update={"max_micro_usd": None})) == 3600
    assert max_seconds(spec, offer, ctx.model_copy(update={"max_micro_usd": 0})) == 1  # never "no limit"


def test_spent_and_remaining_count_every_attempt():
    spec = JobSpec(name="t", entrypoint="python t.py", limits={"max_usd": "0.0001"})
    assert cost_cap.remaining(spec, [], 0.0) == 100 and not cost_cap.reached(spec, [], 0.0)
    assert cost_cap.remaining(JobSpec(name="t", entrypoint="python t.py"), [], 0.0) is None
    assert cost_cap.reason(spec, 101) == "stopped at the cost cap limits.max_usd = $0.0001 (spent $0.000101)"


def test_the_own_estimate_prefers_steps_then_the_names_history():
    stepped = JobSpec(name="t", entrypoint="python t.py --steps 200")
    runs = [PastRun(hours=0.01, steps=100), PastRun(hours=0.03, steps=100)]
    hours, basis = own_estimate(stepped, runs)
    assert hours == pytest.approx(0.04) and basis.startswith("200 steps (--steps) × 0.72 s/step from 2 earlier run(s) of 't'")
    hours, basis = own_estimate(JobSpec(name="t", entrypoint="python t.py"), runs)
    assert hours == pytest.approx(0.02) and basis.startswith("history of 't': median of 2 earlier run(s)")
    assert own_estimate(stepped, []) is None


def test_dry_run_and_offers_say_where_the_estimate_came_from(job_factory, tmp_path):
    home = tmp_path / "home"
    quick = "import time\ntime.sleep(0.3)\n"
    given = job_factory(quick, "estimated_hours: 0.002\noutputs:\n  optional: true\n", name="given")
    dry = json.loads(tm("submit", str(given), "--dry-run", "--json", home=home).stdout)
    assert dry["estimate"] == "estimated_hours 0.002 (hours)"  # a CPU job: no GPU-hours (#33 §3)
    stepped = job_factory(quick, "outputs:\n  optional: true\n", name="stepped", entrypoint="python train.py --steps 50")
    assert tm("submit", str(stepped), "--wait", home=home).returncode == 0
    human = tm("submit", str(stepped), "--dry-run", home=home).stdout
    assert "estimate: 50 steps (--steps) × " in human and "from 1 earlier run(s) of 'stepped'" in human
    other = job_factory(quick, "outputs:\n  optional: true\n", name="stepped", entrypoint="python train.py")
    dry = json.loads(tm("submit", str(other), "--dry-run", "--json", home=home).stdout)
    assert dry["estimate"].startswith("history of 'stepped': median of 1 earlier run(s)")
    stranger = job_factory(quick, "outputs:\n  optional: true\n", name="stranger")
    offers = json.loads(tm("offers", str(stranger), "--json", home=home).stdout)
    assert offers["basis"].startswith("history of ")  # the class's, with no run of its own name
    assert "history of 'stranger'" not in offers["basis"]

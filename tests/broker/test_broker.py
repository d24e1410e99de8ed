"""The broker's life of a job: recorded exactly, resumable after a crash, and nothing half-written on bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest

from trainmaster.backends.base import Offer, OfferRequest
from trainmaster.broker import paths
from trainmaster.broker.service import Broker
from trainmaster.broker.stages import ledger_moves
from broker_support import sync_broker
from trainmaster.jobs.bundle import BundleError
from trainmaster.broker.planning.policy import load_policy
from trainmaster.jobs.spec import JobSpec
from trainmaster.jobs.yamlfile import FileError

WRITE_OUTPUT = """
    import os, pathlib
    pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "result.txt").write_bytes(b"w" * 1000)
    print("trained")
"""


def nothing_recorded(broker: Broker) -> bool:
    bundles = list(paths.bundles_dir().glob("*")) if paths.bundles_dir().exists() else []
    return broker.store.jobs() == [] and bundles == []


def test_a_job_runs_to_accepted_with_an_exact_record(broker, job_factory):
    job = broker.wait(broker.submit(job_factory(WRITE_OUTPUT)).id, timeout_s=60)
    assert job.state == "accepted"
    events = broker.store.events(job.id)
    assert [e.to_state for e in events if e.kind == "transition"] == [
        "submitted", "planned", "dispatched", "running", "returned", "verifying", "accepted"]
    [attempt] = broker.store.attempts(job.id)
    assert attempt.state == "accepted" and attempt.started_at < attempt.ended_at
    import hashlib
    assert broker.store.outputs(attempt.id) == [("result.txt", 1000, hashlib.sha256(b"w" * 1000).hexdigest())]
    verdict = json.loads((paths.job_dir(job.id) / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted" and verdict["checks"] == ["integrity", "safety", "outcome"]


def test_a_new_process_resumes_watching_a_running_job(tm_home, job_factory):
    spec = job_factory("import time\ntime.sleep(2)\n" + textwrap.dedent(WRITE_OUTPUT))
    first = sync_broker()
    job = first.submit(spec)
    first.close()  # the submitting CLI exits while the job runs
    assert job.state in ("dispatched", "running")
    code = ("import asyncio; from trainmaster.broker.service import Broker; "
            f"print(asyncio.run(Broker().wait({job.id!r}, timeout_s=60)).state)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "accepted"


CRASH_BEFORE_HANDLE = """
import asyncio, os, sys
from trainmaster.broker.store import Store
Store.set_handle = lambda self, *a, **k: os._exit(9)  # the process dies right after the job was started
from trainmaster.broker.service import Broker
asyncio.run(Broker().submit(sys.argv[1]))
"""


def test_a_dispatch_that_crashed_before_recording_its_handle_is_not_started_twice(broker, job_factory):
    spec_path = job_factory("import time\ntime.sleep(1)\n" + textwrap.dedent(WRITE_OUTPUT))
    crashed = subprocess.run([sys.executable, "-c", CRASH_BEFORE_HANDLE, str(spec_path)], capture_output=True, text=True)
    assert crashed.returncode == 9, crashed.stderr
    [job] = broker.store.jobs()
    [attempt] = broker.store.attempts(job.id)
    assert job.state == "dispatched" and attempt.handle_json is None
    job = sync_broker().wait(job.id, timeout_s=60)
    assert job.state == "accepted"
    log = (paths.attempt_dir(job.id, 1) / "job.log").read_text()
    assert log.count("[trainmaster] $") == 1 and log.count("trained") == 1
    assert len(broker.store.attempts(job.id)) == 1


def test_invalid_spec_records_nothing(broker, job_factory):
    spec = job_factory("print(1)\n", "resources:\n  gpu: 1\n")
    with pytest.raises(FileError):
        broker.submit(spec)
    assert nothing_recorded(broker)


def test_bundle_over_its_limit_records_nothing(broker, job_factory):
    spec = job_factory("print(1)\n", "limits:\n  max_bundle_mb: 1\n")
    (spec.parent / "data.bin").write_bytes(b"x" * (2 * 2**20))
    with pytest.raises(BundleError, match="limit"):
        broker.submit(spec)
    assert nothing_recorded(broker)


def test_symlink_out_of_the_code_dir_records_nothing(broker, job_factory, tmp_path):
    spec = job_factory("print(1)\n")
    (tmp_path / "secret.txt").write_text("s")
    (spec.parent / "link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(BundleError, match="link.txt"):
        broker.submit(spec)
    assert nothing_recorded(broker)


FETCH_WITH_SMALL_DISK = """
import asyncio, resource, signal, sys
from trainmaster.backends.base import BackendError
from trainmaster.broker.service import Broker
import trainmaster.backends.transfer as transfer
transfer._hard_link = lambda path, target: False  # copy, so that the small disk fills
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1_500_000, resource.RLIM_INFINITY))
try:
    asyncio.run(Broker().advance(sys.argv[1]))
except BackendError as exc:
    print("ERROR", exc)
"""


def test_full_disk_while_fetching_leaves_the_attempt_returned_and_a_retry_succeeds(broker, job_factory):
    script = """
        import os, pathlib
        pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "big.dat").write_bytes(b"x" * 3_000_000)
    """
    job = broker.submit(job_factory(script))
    from local_attempt import wait_ended

    wait_ended(paths.attempt_dir(job.id, 1), 30)
    out = subprocess.run([sys.executable, "-c", FETCH_WITH_SMALL_DISK, job.id], capture_output=True, text=True)
    assert "ERROR fetching the outputs from local: no space left while writing to" in out.stdout, out.stdout + out.stderr
    assert broker.store.job(job.id).state == "returned"
    [said] = [e.detail for e in broker.store.events(job.id) if e.kind == "error"]  # what to fix, on the attempt
    assert said["cause"] == "our_environment" and "free some space" in said["message"], said
    job_dir = paths.job_dir(job.id)
    assert not (job_dir / "outputs").exists() and not list(job_dir.glob(".outputs*"))
    job = broker.wait(job.id, timeout_s=30)
    assert job.state == "accepted"
    assert (job_dir / "outputs" / "big.dat").stat().st_size == 3_000_000


def test_a_vanished_attempt_replans_and_fails_when_no_backend_is_left(broker, job_factory):
    """An infrastructure failure (not the script's exit code) blocks the offer and re-plans."""
    import os, signal, time
    job = broker.submit(job_factory("import time\ntime.sleep(60)\n"))
    sup = paths.attempt_dir(job.id, 1) / "supervisor.json"
    while not sup.exists():
        time.sleep(0.05)
    os.killpg(json.loads(sup.read_text())["pid"], signal.SIGKILL)
    time.sleep(0.3)
    job = broker.wait(job.id, timeout_s=30)
    assert job.state == "failed"
    assert "the job failed on local, and no other backend is allowed by the policy" in job.reason  # the offer is blocked
    kinds = [(e.kind, e.to_state) for e in broker.store.events(job.id)]
    assert ("transition", "planned") in kinds[kinds.index(("attempt", "failed")):]


def test_local_offer_is_priced_by_the_policy_power_model(broker):
    import asyncio

    spec = JobSpec(name="x", entrypoint="python t.py")
    [offer] = asyncio.run(broker.backend("local", load_policy()).offers(OfferRequest(spec=spec))).offers
    assert isinstance(offer, Offer) and not offer.spot
    assert broker.plan(spec, load_policy()).chosen.offer.trusted  # the broker stamps the registry's trust; the backend's offer does not carry it
    assert offer.price_per_hour_micro_usd == (120 * 150_000 + 999) // 1000  # host watts × $/kWh, no GPU


def _policy_with_budget(tmp_path, cap: str) -> str:
    path = tmp_path / "tight.yaml"
    path.write_text(f"name: tight\ndefault:\n  primary: local\nbudgets:\n  - name: tiny\n    period: total\n    cap: {cap}\n")
    return str(path)


def test_money_is_reserved_on_dispatch_and_charged_once_on_acceptance(broker, job_factory):
    from trainmaster.wallet.ledger import Ledger

    job = broker.wait(broker.submit(job_factory(WRITE_OUTPUT)).id, timeout_s=60)
    [attempt] = broker.store.attempts(job.id)
    ledger = Ledger(paths.state_db())
    kinds = [(e.kind, e.key) for e in ledger.entries() if e.job_id == job.id]
    assert kinds == [("reserve", f"reserve:{attempt.id}.p1"), ("charge", f"charge:{attempt.id}")]
    assert attempt.reserve_key == f"reserve:{attempt.id}.p1"
    [charge] = [e for e in ledger.entries() if e.kind == "charge"]
    assert charge.micro_usd == attempt.cost_micro_usd
    # settling again (a resumed process) pays nothing twice
    ledger_moves.settle_money(broker.parts.of(job), attempt, "accepted")
    assert len([e for e in ledger.entries() if e.job_id == job.id]) == 2
    [row] = ledger.spend(by="job")
    assert row.micro_usd == attempt.cost_micro_usd


def test_a_budget_that_cannot_hold_the_estimate_refuses_the_dispatch(broker, job_factory, tmp_path):
    spec = job_factory(WRITE_OUTPUT, "limits:\n  max_hours: 10\n")  # 10 h × the local price is over $0.01
    job = broker.submit(spec, _policy_with_budget(tmp_path, "0.01"))
    assert job.state == "failed" and "refused by budget" in job.reason and "tiny" in job.reason
    assert broker.store.attempts(job.id) == []


def test_a_pickle_among_trusted_outputs_is_kept_opaque_and_never_loaded(broker, job_factory, tmp_path):
    """Local compute is trusted: the pickle is recorded opaque (refused from untrusted compute:
    tests/verify/test_outputs_judged.py)."""
    marker = tmp_path / "pwned"
    script = f"""
        import os, pathlib, pickle
        class Bomb:
            def __reduce__(self):
                return (pathlib.Path.touch, (pathlib.Path({str(marker)!r}),))
        pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "model.pt").write_bytes(pickle.dumps(Bomb()))
    """
    job = broker.wait(broker.submit(job_factory(script)).id, timeout_s=60)
    assert job.state == "accepted"
    [attempt] = broker.store.attempts(job.id)
    assert attempt.state == "accepted" and [p for p, _, _ in broker.store.outputs(attempt.id)] == ["model.pt"]
    assert not marker.exists()
    verdict = json.loads((paths.job_dir(job.id) / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted"
    assert [o["path"] for o in verdict["evidence"]["safety"]["opaque"]] == ["model.pt"]


def test_the_planner_learns_runtimes_and_failure_rates_from_past_attempts(broker, job_factory):
    from trainmaster.broker.stages.offer_rounds import learned

    for _ in range(2):
        broker.wait(broker.submit(job_factory("import time\ntime.sleep(0.5)\n", "outputs:\n  optional: true\n")).id,
                    timeout_s=60)
    history, rates = learned(broker.store.ended_attempts())
    assert 0.5 / 3600 < history["development"] < 30 / 3600
    assert rates == {}  # too few attempts to price risk yet
    _, rates = learned(broker.store.ended_attempts() * 3)
    assert rates == {"local:on-demand": 0.0}
    # a job with no estimate and no max_hours is now planned on its class's history, not a default hour
    result = broker.plan(JobSpec(name="x", entrypoint="python t.py"), load_policy())
    assert result.chosen.hours == math.ceil(history["development"] * 3600) / 3600  # planned in whole seconds

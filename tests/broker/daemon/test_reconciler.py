"""The reconciler's leases: two processes never advance the same job at once; a lease's time comes from the
database; `status X` advances X alone, never another job (its fetch, its audit). On SQLite and PostgreSQL (the
`database` fixture sets TRAINMASTER_DATABASE_URL for the latter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from cli_run import tm

from trainmaster.broker import paths
from trainmaster.broker.daemon.leases import Leases
from trainmaster.broker.store import Store
from repo_paths import TESTS

HERE = TESTS


def _open_job(store: Store, job_id: str) -> None:
    store.create_job(job_id=job_id, name="open", workload="development", project=None, spec_json="{}",
                     spec_path="job.yaml", bundle_sha256="0" * 64, policy="default", policy_json="{}")


def test_a_lease_is_one_holders_until_it_expires_or_is_released(tm_home, database):
    leases = Leases(paths.state_db())
    assert leases.claim("j", "a", 0.5) and leases.claim("j", "a", 0.5)  # a holder takes its own lease again
    assert not leases.claim("j", "b", 0.5) and leases.holder("j") == "a"
    assert not leases.renew("j", "b", 0.5) and leases.renew("j", "a", 0.5)
    time.sleep(0.6)
    assert leases.holder("j") is None and leases.claim("j", "b", 0.5)  # expired: another takes it
    leases.release("j", "a")  # not a's any more: nothing happens
    assert leases.holder("j") == "b"
    leases.release("j", "b")
    assert leases.live() == 0 and leases.claim("j", "a", 5)


def test_holders_claiming_one_job_at_once_one_wins(tm_home, database):
    """Eight holders, each on its own connection, claim the same free job at the same moment: one gets it."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    Leases(paths.state_db()).close()  # the table made once, so the race is about the claim only
    barrier = threading.Barrier(8)

    def claim(n: int) -> bool:
        leases = Leases(paths.state_db())
        try:
            barrier.wait()
            return leases.claim("j", f"holder-{n}", 30)
        finally:
            leases.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        won = list(pool.map(claim, range(8)))
    assert sum(won) == 1
    assert Leases(paths.state_db()).holder("j") == f"holder-{won.index(True)}"


def test_two_reconciler_processes_never_advance_the_same_job_at_once(tm_home, database, tmp_path):
    store = Store(paths.state_db())
    for n in range(8):
        _open_job(store, f"job-{n}")
    store.close()
    out, start_at = tmp_path / "advanced.jsonl", time.time() + 3
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, str(HERE / "reconcile_driver.py"), str(out), str(start_at)],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    for job_id in {r[0] for r in runs}:
        spans = sorted((start, end, pid) for j, pid, start, end in runs if j == job_id)
        for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
            assert start >= end, f"{job_id} advanced by two processes at once: {spans}"
    assert {r[0] for r in runs} == {f"job-{n}" for n in range(8)}
    assert sum(len(r["skipped"]) for r in results) > 0  # they did contend: a leased job was skipped
    assert Leases(paths.state_db()).live() == 0  # every lease released


def test_status_of_one_job_never_advances_another(tm_home, database):
    store = Store(paths.state_db())
    _open_job(store, "other-1")  # unfinished: advancing it records an error (its spec is empty)
    _open_job(store, "mine-1")
    store.move_job("mine-1", "cancelled", reason="cancelled by the user")
    before = len(store.events("other-1"))
    no_pass = {"TRAINMASTER_BACKGROUND_S": "0"}  # a read starts no background pass
    assert tm("status", "mine-1", home=tm_home, extra_env=no_pass).returncode == 1  # cancelled
    assert tm("ls", home=tm_home, extra_env=no_pass).returncode == 0
    assert len(store.events("other-1")) == before  # reads never advance a job, theirs or another's
    tm("ls", home=tm_home)  # the background pass it starts does advance it
    deadline = time.time() + 60
    while len(store.events("other-1")) == before and time.time() < deadline:
        time.sleep(0.3)
    assert len(store.events("other-1")) > before

"""The local machine as a resource: what `allocation.fit` grants beside the claims held, the inventory
backends.yaml can set, and the store's first-come-first-served queue of jobs that do not fit now."""

from __future__ import annotations

import pytest

from trainmaster.backends.hardware import Gpu, Machine
from trainmaster.backends.local import allocation
from trainmaster.backends.local.allocation import Claim
from trainmaster.backends.local.backend import LocalBackend, inventory
from trainmaster.backends.local.config import LocalConfig
from trainmaster.broker.store import Store
from trainmaster.jobs.spec import JobSpec

TWO_GPUS = Machine(cpus=8, memory_mb=64 * 1024, gpus=(Gpu(0, "NVIDIA A100", 81920), Gpu(1, "NVIDIA A100", 81920)))


def spec(**resources) -> JobSpec:
    return JobSpec(name="t", entrypoint="python t.py", resources=resources)


def test_gpus_are_exclusive_on_a_fake_inventory_of_two():
    first = allocation.fit(TWO_GPUS, spec(gpus=1), [])
    second = allocation.fit(TWO_GPUS, spec(gpus=1), [first.claim])
    third = allocation.fit(TWO_GPUS, spec(gpus=1), [first.claim, second.claim])
    assert (first.claim.gpus, second.claim.gpus) == ((0,), (1,))
    assert third.claim is None and "1 GPU(s) asked, 0 suitable free (held: 0, 1)" in third.why
    freed = allocation.fit(TWO_GPUS, spec(gpus=1), [second.claim])  # the first one's run ended
    assert freed.claim.gpus == (0,)
    assert allocation.fit(TWO_GPUS, spec(gpus=2), [second.claim]).claim is None


def test_gpu_type_and_size_narrow_which_gpus_a_job_may_get():
    mixed = Machine(cpus=8, memory_mb=65536, gpus=(Gpu(0, "RTX 4090", 24564), Gpu(1, "NVIDIA A100", 81920)))
    assert allocation.fit(mixed, spec(gpus=1, gpu_types=["A100"]), []).claim.gpus == (1,)
    assert allocation.fit(mixed, spec(gpus=1, min_vram_gb=40), []).claim.gpus == (1,)
    held = [Claim(cpus=1, gpus=(1,))]
    assert allocation.fit(mixed, spec(gpus=1, gpu_types=["A100"]), held).claim is None
    assert allocation.fit(mixed, spec(gpus=1), held).claim.gpus == (0,)


def test_cpus_and_memory_are_claimed_by_request():
    machine = Machine(cpus=2, memory_mb=8 * 1024)
    got = allocation.fit(machine, spec(cpus=2, memory_gb=4), [])
    assert got.claim == Claim(cpus=2, memory_mb=4096, gpus=())
    waits = allocation.fit(machine, spec(cpus=2), [got.claim])
    assert waits.claim is None and waits.why == "2 CPU(s) asked, 0 of 2 free"
    memory = allocation.fit(machine, spec(cpus=1, memory_gb=6), [Claim(cpus=1, memory_mb=4096)])
    assert memory.claim is None and memory.why == "6 GB of memory asked, 4 GB of 8 GB free"
    assert allocation.fit(machine, spec(processes=2), []).claim.cpus == 2  # one core per training process on CPU


def test_backends_yaml_sets_the_inventory_the_backend_allocates():
    config = LocalConfig(cpus=3, memory_gb=5, gpus=[{"name": "A100", "memory_gb": 80}, {"name": "A100", "memory_gb": 80}])
    machine = inventory(config)
    assert (machine.cpus, machine.memory_mb) == (3, 5 * 1024)
    assert [(g.index, g.name, g.memory_mb) for g in machine.gpus] == [(0, "A100", 81920), (1, "A100", 81920)]
    backend = LocalBackend(config)
    claim, why = backend.fit(spec(gpus=2), [])
    assert claim == {"cpus": 1, "memory_mb": 0, "gpus": [0, 1]} and why == ""


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def _job(store: Store, job_id: str) -> None:
    store.create_job(job_id=job_id, name="t", workload="development", project=None, spec_json="{}",
                     spec_path="/x", bundle_sha256="0" * 64, policy="default", policy_json="{}")
    store.set_plan(job_id, "{}", detail={})


def test_the_store_queues_first_come_first_served_and_frees_a_claim_when_its_attempt_ends(store):
    machine = Machine(cpus=2, memory_mb=8192)
    one_at_a_time = spec(cpus=2)

    def fit(held):
        got = allocation.fit(machine, one_at_a_time, [Claim.of(c) for c in held])
        return (got.claim.to_dict() if got.claim else None), got.why

    for job_id in ("a", "b", "c"):
        _job(store, job_id)
    assert store.claim("a", "a.1", "local", fit) == {"cpus": 2, "memory_mb": 0, "gpus": []}
    assert store.claim("a", "a.1", "local", fit) == {"cpus": 2, "memory_mb": 0, "gpus": []}  # a retry finds it
    assert store.claim("b", "b.1", "local", fit) is None
    assert store.claim("c", "c.1", "local", fit) is None
    assert [j.id for j in store.queued_jobs()] == ["b", "c"]
    assert (store.queue_position("b"), store.queue_position("c"), store.queue_position("a")) == (1, 2, None)
    assert store.holders() == ["a"]
    queued = [e for e in store.events("c") if e.to_state == "queued"]
    assert queued[0].detail == {"waiting": "1 job(s) queued before it", "position": 2}
    assert store.start_preview("local", fit) == "would wait in the queue, behind 2 job(s)"
    store.create_attempt("a", backend="local", offer_json="{}", reserve_key="r", seed=0)
    store.move_attempt("a.1", "failed", job_target="failed", reason="done")  # its run ended: the claim frees
    assert store.holders() == []
    assert store.claim("c", "c.1", "local", fit) is None  # b is ahead of it
    assert store.claim("b", "b.1", "local", fit) == {"cpus": 2, "memory_mb": 0, "gpus": []}
    assert store.holders() == ["b"]  # held while b is being dispatched, before its attempt exists
    store.create_attempt("b", backend="local", offer_json="{}", reserve_key="r", seed=0)
    assert store.job("b").state == "dispatched" and store.queue_position("c") == 1

"""The managed backend's own logic over a folder store (tests/managed_support.py): what it uploads, what a resumed
attempt gets, which outputs it accepts, how it reads logs and prices an attempt."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

import pytest

from trainmaster.backends.base import AttemptContext, BackendError, Cause, ExecutorFault, Offer, Phase
from trainmaster.backends.managed.training_service import ServiceState
from trainmaster.jobs import environment
from trainmaster.jobs import launch_plan as plan
from trainmaster.jobs.spec import JobSpec

from managed_support import FolderBackend
from trainmaster.backends.managed.names import fits, job_name

SHA = "a" * 64


def spec(**resources) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "entrypoint": "python train.py", "resources": resources})


def offer(**kw) -> Offer:
    return Offer(backend="aws", instance="ml.m5.large", region="us-east-1", price_per_hour_micro_usd=3_600_000, **kw)


def ctx(attempt: str, resume_from: str | None = None) -> AttemptContext:
    return AttemptContext(job_id="job1", attempt_id=attempt, bundle_sha256=SHA, seed=7, workdir="/nonexistent",
                          resume_from=resume_from)


@pytest.fixture
def backend(tmp_path):
    return FolderBackend(tmp_path / "store")


@pytest.fixture
def bundle(tmp_path):
    path = tmp_path / "bundle.tar"
    path.write_bytes(b"x" * 1000)
    return path


def put(backend, key: str, data: bytes) -> None:
    path = backend.store.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def finish_outputs(backend, attempt: str, files: dict[str, bytes], manifest: dict | None = None) -> None:
    sync = f"attempts/{attempt}/sync/"
    for name, data in files.items():
        put(backend, sync + "outputs/" + name, data)
    listed = manifest if manifest is not None else {
        name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    put(backend, sync + plan.SYNC_MANIFEST, json.dumps({"files": listed}).encode())


def test_submit_uploads_a_bundle_once_and_starts_one_job_per_attempt(backend, bundle):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    again = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    asyncio.run(backend.submit(bundle, spec(nodes=2), offer(), ctx("att2")))
    shared = [key for key in backend.store.uploads if not key.startswith("attempts/")]
    assert shared[0] == f"bundles/{SHA}.tar" and len(shared) == 2  # content-addressed: each sent once
    assert re.fullmatch(r"runtime/[0-9a-f]{64}\.zip", shared[1])  # trainmaster itself, for the container
    assert handle == again and list(backend.service.jobs) == [job_name("att1"), job_name("att2")]
    job = backend.service.jobs[job_name("att2")]
    inputs = backend.store.root / "attempts" / "att2" / "input"
    assert sorted(p.name for p in inputs.iterdir()) == ["boot.py", "launch.json", "runtime.zip"]
    launch = plan.LaunchPlan.model_validate_json((inputs / "launch.json").read_text())
    assert (job.instance_count, launch.nodes, launch.service, launch.bundle_sha256) == (2, 2, "sagemaker", SHA)
    assert launch.env["TRAINMASTER_SEED"] == "7" and launch.env["TRAINMASTER_JOB_ID"] == "job1"
    assert job.sync_uri.endswith("attempts/att2/sync/") and job.input_uri.endswith("attempts/att2/input/")
    assert (inputs / "runtime.zip").read_bytes() == (backend.store.root / shared[1]).read_bytes()
    assert plan.VARIABLE not in job.env  # the plan is a file of the input, never a variable


def test_the_specs_checkpoint_section_travels_in_the_launch_plan(backend, bundle):
    """keep_every, max_disk_gb and selfcheck: false reach the runtime in the container as on local (the managed
    backends sent segment_steps alone, so the runtime there kept every state and always ran its self-check)."""
    job = JobSpec.model_validate({"name": "t", "entrypoint": "python train.py", "checkpoint": {
        "segment_steps": 10, "keep_every": 2, "max_disk_gb": 1.5, "selfcheck": False}})
    asyncio.run(backend.submit(bundle, job, offer(), ctx("att1")))
    launch = plan.LaunchPlan.model_validate_json((backend.store.root / "attempts/att1/input/launch.json").read_text())
    assert {k: v for k, v in launch.env.items() if k in environment.ALL} == {
        "TRAINMASTER_JOB_ID": "job1", "TRAINMASTER_SEED": "7", "TRAINMASTER_BUNDLE_SHA256": SHA,
        "TRAINMASTER_SEGMENT_STEPS": "10", "TRAINMASTER_KEEP_EVERY": "2", "TRAINMASTER_MAX_DISK_GB": "1.5",
        "TRAINMASTER_SELFCHECK": "0"}  # the folders and the resume point are the launcher's, on its side


def test_the_setup_travels_as_a_script_of_the_input(tmp_path, bundle):
    backend = FolderBackend(tmp_path / "store")
    backend.config = backend.config.model_copy(update={"setup": "pip install --no-deps my-extra==1.0"})
    asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    assert (backend.store.root / "attempts/att1/input/setup.sh").read_text() == "pip install --no-deps my-extra==1.0\n"


def test_job_names_fit_every_service_and_stay_unique():
    ids = ["lm-1a2b3c4d.1", "lm-1a2b3c4d.2", "a.b", "a-b", "x" * 200 + ".1", "x" * 200 + ".2", "Upper_Case.1"]
    names = [job_name(i) for i in ids]
    assert all(fits(n) for n in names), names
    assert len(set(names)) == len(names)
    assert names == [job_name(i) for i in ids]  # stable: a repeated submit finds the job it created


def test_a_resumed_attempt_gets_the_earlier_checkpoints_and_metrics_copied_into_its_synced_folder(backend, bundle):
    earlier = "attempts/att1/sync/"
    put(backend, earlier + "checkpoints/segments/00000000/manifest.json", b'{"step": 5}')
    put(backend, earlier + "checkpoints/segments/00000001/manifest.json", b'{"step": 10}')
    put(backend, earlier + "outputs/metrics.jsonl", b'{"step": 1}\n')
    put(backend, earlier + "log/0000000000000000.log", b"old log")
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    ref = asyncio.run(backend.last_checkpoint(handle))
    assert (ref.segment, ref.step) == (1, 10)
    asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att2", resume_from=ref.uri)))
    now = {o.key for o in asyncio.run(backend.store.list("attempts/att2/sync/"))}
    assert now == {"attempts/att2/sync/checkpoints/segments/00000000/manifest.json",
                   "attempts/att2/sync/checkpoints/segments/00000001/manifest.json",
                   "attempts/att2/sync/outputs/metrics.jsonl"}  # not the log


def test_a_resume_point_outside_the_store_is_refused(backend, bundle):
    with pytest.raises(BackendError, match="not an attempt of this"):
        asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att2", resume_from="s3://elsewhere/x")))


def test_last_checkpoint_skips_a_segment_whose_manifest_does_not_read(backend, bundle):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    assert asyncio.run(backend.last_checkpoint(handle)) is None
    put(backend, "attempts/att1/sync/checkpoints/segments/00000000/manifest.json", b'{"step": 5}')
    put(backend, "attempts/att1/sync/checkpoints/segments/00000001/manifest.json", b'{"step": "x"}')
    assert asyncio.run(backend.last_checkpoint(handle)).segment == 0


def test_fetch_takes_what_the_manifest_lists_and_checks_every_hash(backend, bundle, tmp_path):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    files = {"model.safetensors": b"weights" * 100, "sub/result.json": b"{}"}
    finish_outputs(backend, "att1", files)
    seen = []
    got = asyncio.run(backend.fetch(handle, tmp_path / "out", lambda done, total: seen.append((done, total))))
    assert {f.path for f in got} == set(files)
    assert (tmp_path / "out" / "sub" / "result.json").read_bytes() == b"{}"
    assert seen[-1] == (702, 702)


@pytest.mark.parametrize("case", ["extra file", "wrong size", "wrong hash", "no manifest", "escaping path"])
def test_fetch_refuses_outputs_that_differ_from_the_manifest_and_leaves_nothing(backend, bundle, tmp_path, case):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    data = b"weights"
    good = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if case == "extra file":
        finish_outputs(backend, "att1", {"a": data}, manifest={})
    elif case == "wrong size":
        finish_outputs(backend, "att1", {"a": data}, manifest={"a": {**good, "size": 3}})
    elif case == "wrong hash":
        finish_outputs(backend, "att1", {"a": data}, manifest={"a": {**good, "sha256": "0" * 64}})
    elif case == "escaping path":
        put(backend, "attempts/att1/sync/outputs/../../evil", data)  # the listing shows it under outputs/ only if named so
        finish_outputs(backend, "att1", {}, manifest={"../../../evil": good})
    with pytest.raises((BackendError, ExecutorFault)):
        asyncio.run(backend.fetch(handle, tmp_path / "out", None))
    assert not (tmp_path / "out").exists()


def test_logs_are_read_by_offset_and_complete_only_once_the_job_ended(backend, bundle):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    put(backend, "attempts/att1/sync/log/0000000000000000.log", b"hello\n")  # closed parts, named by their offset
    put(backend, "attempts/att1/sync/log/0000000000000006.log", b"world\n")
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.running)
    first = asyncio.run(backend.logs(handle, 0))
    assert (first.text, first.next_offset, first.complete) == ("hello\n", 6, False)
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.succeeded)
    middle = asyncio.run(backend.logs(handle, 2))
    assert (middle.text, middle.next_offset, middle.complete) == ("llo\n", 6, False)  # more parts follow
    last = asyncio.run(backend.logs(handle, 6))
    assert (last.text, last.complete) == ("world\n", True)
    assert asyncio.run(backend.logs(handle, 12)).text == ""


def test_a_failed_job_carries_the_launchers_exit_code_and_reason(backend, bundle):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    put(backend, "attempts/att1/sync/exit.json", json.dumps({"exit_code": 3, "reason": "exited with code 3: boom"}).encode())
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.failed, reason="AlgorithmError: non-zero exit")
    status = asyncio.run(backend.status(handle))
    assert (status.exit_code, status.reason) == (3, "exited with code 3: boom")


def test_a_preempted_job_keeps_the_services_reason_with_the_launchers_exit_code(backend, bundle):
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    put(backend, "attempts/att1/sync/exit.json", json.dumps({"exit_code": 143, "reason": "killed by SIGTERM"}).encode())
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.failed, cause=Cause.preempted,
                                                     reason="the spot instance was reclaimed")
    status = asyncio.run(backend.status(handle))
    assert (status.cause, status.exit_code, status.reason) == (Cause.preempted, 143, "the spot instance was reclaimed")


def test_cost_is_the_recorded_price_times_billable_seconds_times_instances_plus_estimated_parts(backend, bundle):
    handle = asyncio.run(backend.submit(bundle, spec(nodes=2), offer(), ctx("att1")))
    finish_outputs(backend, "att1", {"model": b"m" * 10**6})
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.succeeded, started_at=0, ended_at=500,
                                                     billable_seconds=100)
    cost = asyncio.run(backend.cost(handle, offer()))
    compute = 100 * 2 * 1000  # 100 s × 2 instances × $3.6/h = 1000 µUSD/s
    egress = -(-10**6 * 90_000 // 10**9)
    assert cost.micro_usd > compute + egress and cost.micro_usd - compute - egress < 100  # storage: a few µUSD
    assert cost.billable_seconds == 200 and "billable seconds" in cost.basis and "egress (estimated)" in cost.basis


def test_a_service_that_bills_spot_as_fewer_seconds_is_charged_at_the_on_demand_price(backend, bundle):
    spot = offer(spot=True, detail={"on_demand_micro_usd_per_hour": 7_200_000})
    handle = asyncio.run(backend.submit(bundle, spec(), spot, ctx("att1")))
    finish_outputs(backend, "att1", {})
    ended = dict(phase=Phase.succeeded, started_at=0, ended_at=500, billable_seconds=100)
    backend.service.states[job_name("att1")] = ServiceState(**ended)  # billed at the spot price recorded at dispatch
    assert asyncio.run(backend.cost(handle, spot)).micro_usd - 100 * 1000 in range(0, 10)  # + a few µUSD of storage
    backend.service.states[job_name("att1")] = ServiceState(**ended, billed_at_on_demand=True)  # SageMaker managed spot
    charged = asyncio.run(backend.cost(handle, spot))
    assert charged.micro_usd - 100 * 2000 in range(0, 10) and "on-demand price" in charged.basis


def test_a_running_job_is_described_at_most_every_poll_s_and_an_ended_one_never_again(tmp_path, bundle):
    backend = FolderBackend(tmp_path / "store", poll_s=3600)
    handle = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att1")))
    calls = []
    describe = backend.service.describe

    async def counted(name):
        calls.append(name)
        return await describe(name)

    backend.service.describe = counted
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.running)
    assert asyncio.run(backend.status(handle)).phase is Phase.running
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.succeeded)
    assert asyncio.run(backend.status(handle)).phase is Phase.running and len(calls) == 1  # within poll_s
    backend._seen.clear()  # poll_s has passed
    assert asyncio.run(backend.status(handle)).phase is Phase.succeeded
    asyncio.run(backend.status(handle))
    assert len(calls) == 2  # an ended job's state never changes: not asked again


def test_a_failed_job_with_no_exit_record_was_stopped_from_outside(backend, bundle):
    """A service that reports no cause (Azure ML's job resource has no error text): with no exit record the
    container never finished, so a spot attempt was preempted and another one lost."""
    spot = asyncio.run(backend.submit(bundle, spec(), offer(spot=True), ctx("att1")))
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.failed, reason="Azure ML job failed")
    status = asyncio.run(backend.status(spot))
    assert status.cause is Cause.preempted and "no exit record" in status.reason
    plain = asyncio.run(backend.submit(bundle, spec(), offer(), ctx("att2")))
    backend.service.states[job_name("att2")] = ServiceState(phase=Phase.failed)
    assert asyncio.run(backend.status(plain)).cause is Cause.lost


def test_a_failed_job_whose_entrypoint_exited_0_was_stopped_from_outside(backend, bundle):
    """A spot VM reclaimed after the entrypoint exited 0 (its exit record synced) but before the service called the
    job completed: the failure is not the job's, so it is a preemption (resumed), never the job's own failure; an
    exit record of a non-zero exit stays the job's failure, with its reason."""
    spot = asyncio.run(backend.submit(bundle, spec(), offer(spot=True), ctx("att1")))
    put(backend, "attempts/att1/sync/" + plan.SYNC_EXIT, json.dumps({"exit_code": 0, "reason": "exited 0"}).encode())
    backend.service.states[job_name("att1")] = ServiceState(phase=Phase.failed, reason="Azure ML job failed")
    status = asyncio.run(backend.status(spot))
    assert status.cause is Cause.preempted and "exited 0" in status.reason and status.exit_code == 0, status
    failing = asyncio.run(backend.submit(bundle, spec(), offer(spot=True), ctx("att2")))
    put(backend, "attempts/att2/sync/" + plan.SYNC_EXIT, json.dumps({"exit_code": 3, "reason": "boom"}).encode())
    backend.service.states[job_name("att2")] = ServiceState(phase=Phase.failed, reason="Azure ML job failed")
    status = asyncio.run(backend.status(failing))
    assert status.cause is None and status.reason == "boom" and status.exit_code == 3, status
    for n, claimed in enumerate((False, 0.0, "0", None)):  # the container's bytes: only an int 0 is an exit 0
        attempt = f"att{3 + n}"
        handle = asyncio.run(backend.submit(bundle, spec(), offer(spot=True), ctx(attempt)))
        put(backend, f"attempts/{attempt}/sync/" + plan.SYNC_EXIT, json.dumps({"exit_code": claimed}).encode())
        backend.service.states[job_name(attempt)] = ServiceState(phase=Phase.failed, reason="Azure ML job failed")
        status = asyncio.run(backend.status(handle))
        assert status.cause is None and status.reason == "Azure ML job failed", (claimed, status)

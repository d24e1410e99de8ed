"""The Ray backend's reading of what Ray says, without a cluster: the Jobs API's states mapped to ours and their
causes (with the launcher's exit record, or without it: lost), the nodes with what they have free, the client's
errors typed, a dashboard that does not answer transient, `backends check` off the network, and the shape of
a Ray Train run (workers, their shares, placement; GPUs beyond one node spanning the nodes that have them)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from trainmaster.backends.base import BackendError, Cause, Phase, TransientBackendError
from trainmaster.backends.ray import check
from trainmaster.backends.ray.backend import _misfit, _spans, _status
from trainmaster.backends.ray.cluster import Jobs, Node, RayJob, _node, nodes
from trainmaster.backends.ray.config import RayConfig
from trainmaster.jobs.spec import JobSpec


def job(status: str, message: str = "", error_type: str | None = None) -> RayJob:
    return RayJob(status=status, message=message, error_type=error_type, started_at=100.0, ended_at=160.0)


@pytest.mark.parametrize("status, phase", [("PENDING", Phase.pending), ("RUNNING", Phase.running)])
def test_a_job_under_way_has_no_cause_and_no_end(status, phase):
    found = _status(job(status), None)
    assert (found.phase, found.cause, found.ended_at, found.started_at) == (phase, None, None, 100.0)


def test_a_job_that_exited_on_its_own_carries_the_launchers_exit_code_and_reason():
    ok = _status(job("SUCCEEDED"), {"exit_code": 0, "reason": "exited with code 0"})
    assert (ok.phase, ok.cause, ok.exit_code, ok.ended_at) == (Phase.succeeded, None, 0, 160.0)
    bad = _status(job("FAILED", "Job entrypoint command failed with exit code 3"),
                  {"exit_code": 3, "reason": "exited with code 3: boom"})
    assert (bad.phase, bad.cause, bad.exit_code, bad.reason) == (Phase.failed, Cause.script_failed, 3,
                                                                 "exited with code 3: boom")


def test_a_failed_job_without_the_exit_record_is_lost_with_rays_word():
    found = _status(job("FAILED", "Job supervisor actor died: the actor died\nmore", "JOB_SUPERVISOR_ACTOR_DIED"), None)
    assert found.phase is Phase.failed and found.cause is Cause.lost and found.exit_code is None
    assert "JOB_SUPERVISOR_ACTOR_DIED: Job supervisor actor died: the actor died" in found.reason
    assert "more" not in found.reason


def test_a_stopped_job_is_cancelled():
    found = _status(job("STOPPED", "Job was intentionally stopped."), None)
    assert (found.phase, found.cause) == (Phase.cancelled, Cause.cancelled)


def test_nodes_offer_what_they_have_free_with_the_gpu_type():
    item = {"node_id": "n1", "node_ip": "10.0.0.2", "is_head_node": False, "state": "ALIVE",
            "resources_total": {"CPU": 16.0, "GPU": 2.0, "memory": 64 * 2**30, "accelerator_type:A100": 1.0}}
    node = _node(item, {})  # not in the usage report yet: all free
    assert (node.cpus, node.gpus, node.gpu_type, node.memory_mb, node.head) == (16, 2, "A100", 65536, False)
    busy = _node(item, {"CPU": [5.5, 16.0], "GPU": [2.0, 2.0], "memory": [16 * 2**30, 64 * 2**30]})
    assert (busy.cpus, busy.gpus, busy.memory_mb) == (10, 0, 49152)
    spec = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py",
                                   "resources": {"gpus": 2, "gpu_types": ["H100"]}})
    assert _misfit(node, spec) == "GPUs of type A100"
    assert _misfit(node, spec.model_copy(update={"resources": spec.resources.model_copy(
        update={"gpu_types": ["A100"]})})) is None


@pytest.mark.parametrize("raised, typed", [
    (RuntimeError("Request failed with status code 503: busy"), TransientBackendError),
    (RuntimeError("Request failed with status code 404: Job x does not exist."), BackendError),
    (ConnectionError("Failed to connect to Ray"), TransientBackendError),
])
def test_the_clients_errors_are_typed(raised, typed):
    def fails():
        raise raised

    with pytest.raises(typed) as caught:
        Jobs("http://127.0.0.1:1", 1.0)._call(fails)
    assert type(caught.value) is typed


def test_a_dashboard_that_does_not_answer_is_transient_for_nodes_status_and_stop():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"http://127.0.0.1:{silent.getsockname()[1]}"
        began = time.monotonic()
        for call in (lambda: nodes(address, 0.5), lambda: Jobs(address, 0.5).info("tm-a"),
                     lambda: Jobs(address, 0.5).stop("tm-a")):
            with pytest.raises(TransientBackendError, match="does not answer"):
                asyncio.run(call())
        assert time.monotonic() - began < 5  # each bounded by the timeout, not held
    with pytest.raises(TransientBackendError, match="does not answer"):  # nothing listens there now
        asyncio.run(Jobs(address, 0.5).info("tm-a"))


def test_check_names_what_the_settings_lack_without_asking_the_cluster(tmp_path):
    assert check.check(RayConfig(address="http://127.0.0.1:1", storage_path=str(tmp_path))) == []
    reasons = check.check(RayConfig(address="127.0.0.1:8265", storage_path="shared/ray"))
    assert any("is not the dashboard's http:// address" in r for r in reasons), reasons
    assert any("is not an absolute path" in r for r in reasons), reasons


def test_each_process_gets_its_share_of_the_cpus_unless_the_spec_says(tmp_path):
    from trainmaster.backends.base import AttemptContext
    from trainmaster.backends.ray.backend import RayBackend

    ctx = AttemptContext(job_id="j", attempt_id="j.1", bundle_sha256="0" * 64, seed=1, workdir=str(tmp_path))
    spec = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py", "resources": {"cpus": 4, "processes": 2}})
    assert RayBackend._plan(spec, ctx, tmp_path).env["OMP_NUM_THREADS"] == "2"  # Ray would give each process 4
    own = spec.model_copy(update={"env": {"OMP_NUM_THREADS": "3"}})
    assert RayBackend._plan(own, ctx, tmp_path).env["OMP_NUM_THREADS"] == "3"


def test_the_specs_checkpoint_section_reaches_the_runtime_on_ray(tmp_path):
    """keep_every, max_disk_gb and selfcheck: false travel in the launch plan's env as on local (they were dropped)."""
    from trainmaster.backends.base import AttemptContext
    from trainmaster.backends.ray.backend import RayBackend

    ctx = AttemptContext(job_id="j", attempt_id="j.1", bundle_sha256="0" * 64, seed=1, workdir=str(tmp_path))
    spec = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py", "checkpoint": {
        "segment_steps": 5, "keep_every": 3, "max_disk_gb": 2, "selfcheck": False}})
    env = RayBackend._plan(spec, ctx, tmp_path).env
    assert {k: env[k] for k in ("TRAINMASTER_SEGMENT_STEPS", "TRAINMASTER_KEEP_EVERY", "TRAINMASTER_MAX_DISK_GB",
                                "TRAINMASTER_SELFCHECK")} == {
        "TRAINMASTER_SEGMENT_STEPS": "5", "TRAINMASTER_KEEP_EVERY": "3", "TRAINMASTER_MAX_DISK_GB": "2.0",
        "TRAINMASTER_SELFCHECK": "0"}


def test_a_job_across_nodes_is_one_ray_train_worker_per_process_with_its_share(tmp_path):
    from trainmaster.backends.ray.backend import RayBackend

    backend = RayBackend(RayConfig(storage_path=str(tmp_path)))
    cpu = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py", "resources": {"nodes": 2}})
    assert backend._run(cpu, "a.1") == {"workers": 2, "cpus": 1, "gpus": 0, "placement": "STRICT_SPREAD",
                                        "storage": str(tmp_path / "ray-train"), "name": "a.1"}
    two_each = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py",
                                       "resources": {"nodes": 2, "gpus": 2, "cpus": 8}})
    assert {k: backend._run(two_each, "a.1")[k] for k in ("workers", "cpus", "gpus", "placement")} == {
        "workers": 4, "cpus": 4, "gpus": 1.0, "placement": "SPREAD"}
    beyond = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py", "resources": {"gpus": 4}})
    assert {k: backend._run(beyond, "a.1")[k] for k in ("workers", "gpus", "placement")} == {
        "workers": 4, "gpus": 1.0, "placement": "PACK"}


def test_more_gpus_than_one_node_has_span_the_nodes_that_have_them_free():
    def node(gpus: int, cpus: int, kind: str = "A100") -> Node:
        return Node(node_id=f"n{gpus}{cpus}{kind}", ip="10.0.0.2", head=False, cpus=cpus, memory_mb=2**16,
                    gpus=gpus, gpu_type=kind)

    four = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py", "resources": {"gpus": 4}})
    assert len(_spans([node(2, 8), node(2, 8)], four)) == 2
    assert _spans([node(2, 8), node(1, 8)], four) == []  # 3 GPUs free in all
    assert _spans([node(2, 8), node(2, 1)], four) == []  # a worker needs a CPU beside its GPU
    typed = four.model_copy(update={"resources": four.resources.model_copy(update={"gpu_types": ["H100"]})})
    assert _spans([node(2, 8), node(2, 8, "H100")], typed) == []
    cpu = JobSpec.model_validate({"name": "j", "entrypoint": "python t.py"})
    assert _spans([node(0, 8), node(0, 8)], cpu) == []  # a CPU job never spans: it fits one node or waits

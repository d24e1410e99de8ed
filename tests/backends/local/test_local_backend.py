"""The local backend, driven through the broker with real processes: run, env, torchrun, cancel, kill, limits."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from trainmaster.backends.base import Handle
from trainmaster.broker import paths

ENV_SCRIPT = """
    import json, os, pathlib
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    keys = [k for k in os.environ if k.startswith("TRAINMASTER_") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GREETING")]
    (out / "env.json").write_text(json.dumps({k: os.environ[k] for k in keys}))
    print("cwd", os.getcwd())
"""


def outputs(job_id: str) -> Path:
    return paths.job_dir(job_id) / "outputs"


def test_job_environment_is_set(broker, job_factory):
    spec = job_factory(ENV_SCRIPT, "seed: 42\ncheckpoint:\n  segment_steps: 10\nenv:\n  GREETING: hello\n")
    job = broker.wait(broker.submit(spec).id, timeout_s=60)
    assert job.state == "accepted", job.reason
    env = json.loads((outputs(job.id) / "env.json").read_text())
    attempt = paths.attempt_dir(job.id, 1)
    assert env["TRAINMASTER_JOB_ID"] == job.id
    assert env["TRAINMASTER_SEED"] == "42" and env["TRAINMASTER_SEGMENT_STEPS"] == "10"
    assert env["TRAINMASTER_OUTPUT_DIR"] == str(attempt / "outputs")
    assert env["TRAINMASTER_CHECKPOINT_DIR"] == str(attempt / "checkpoints")
    assert env["TRAINMASTER_RESUME_FROM"] == ""
    assert env["TRAINMASTER_BUNDLE_SHA256"] == job.bundle_sha256
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["GREETING"]) == ("0", "1", "0", "hello")


@pytest.mark.slow
def test_torchrun_two_processes_with_gloo(broker, job_factory):
    script = """
        import os, pathlib, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        if dist.get_rank() == 0:
            pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "sum.txt").write_text(f"{t.item()} {dist.get_world_size()}")
        dist.destroy_process_group()
    """
    spec = job_factory(script, "launcher: torchrun\nresources:\n  processes: 2\n  cpus: 2\n")
    job = broker.wait(broker.submit(spec).id, timeout_s=120)
    assert job.state == "accepted", job.reason
    assert (outputs(job.id) / "sum.txt").read_text() == "3.0 2"
    launched = (paths.attempt_dir(job.id, 1) / "job.log").read_text()
    assert "torch.distributed.run --standalone --nproc-per-node=2" in launched


def test_nonzero_exit_fails_the_job_with_the_code_and_cost(broker, job_factory):
    spec = job_factory("import sys\nprint('boom')\nsys.exit(3)\n")
    job = broker.wait(broker.submit(spec).id, timeout_s=60)
    assert job.state == "failed"
    [attempt] = broker.store.attempts(job.id)
    assert attempt.state == "failed" and "exited with code 3" in attempt.reason
    assert attempt.cost_micro_usd is not None and attempt.billable_seconds > 0
    assert "boom" in "".join(broker.logs(job.id))


def _wait_for(predicate, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


SLEEPER = """
    import os, pathlib, subprocess, sys, time
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (out / "pids").write_text(f"{os.getpid()} {child.pid}")
    time.sleep(300)
"""


def test_cancel_stops_the_whole_process_group(broker, job_factory):
    job = broker.submit(job_factory(SLEEPER))
    pid_file = paths.attempt_dir(job.id, 1) / "outputs" / "pids"
    assert _wait_for(pid_file.exists)
    pids = [int(p) for p in pid_file.read_text().split()]
    job = broker.cancel(job.id)
    assert job.state == "cancelled"
    assert _wait_for(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids), 15)
    [attempt] = broker.store.attempts(job.id)
    assert attempt.state == "cancelled" and attempt.cost_micro_usd is not None


def test_a_job_killed_mid_run_is_marked_failed_with_the_reason(broker, job_factory):
    job = broker.submit(job_factory(SLEEPER))
    pid_file = paths.attempt_dir(job.id, 1) / "outputs" / "pids"
    assert _wait_for(pid_file.exists)
    supervisor = json.loads((paths.attempt_dir(job.id, 1) / "supervisor.json").read_text())
    os.killpg(supervisor["pid"], signal.SIGKILL)  # as the OOM killer or `kill -9` would
    assert _wait_for(lambda: not psutil.pid_exists(supervisor["pid"]) or psutil.Process(supervisor["pid"]).status() == "zombie")
    job = broker.wait(job.id, timeout_s=30)
    assert job.state == "failed"
    assert "died without finishing" in job.reason


def test_time_limit_stops_the_job(broker, job_factory):
    spec = job_factory("import time\ntime.sleep(60)\n", "limits:\n  max_hours: 0.0005\n")
    job = broker.wait(broker.submit(spec).id, timeout_s=60)
    assert job.state == "failed"
    assert "time limit" in broker.store.attempts(job.id)[0].reason


def test_eight_gpus_fail_at_planning(broker, job_factory):
    from trainmaster.broker.planning.planner import PlanError

    spec = job_factory("print(1)\n", "resources:\n  gpus: 8\n")
    with pytest.raises(PlanError) as info:
        broker.submit(spec)
    assert "needs 8 GPU(s); this machine has none" in str(info.value)
    assert broker.store.jobs() == []


def test_local_cost_is_wall_time_times_power(broker, job_factory):
    job = broker.wait(broker.submit(job_factory("import time\ntime.sleep(1)\n")).id, timeout_s=60)
    [attempt] = broker.store.attempts(job.id)
    offer = json.loads(attempt.offer_json)
    expected = attempt.billable_seconds * offer["price_per_hour_micro_usd"] / 3600
    assert attempt.billable_seconds >= 1.0
    assert abs(attempt.cost_micro_usd - expected) <= 1


@pytest.mark.slow
def test_requirements_environment(broker, job_factory, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the requirement is already in the base environment: no network
    script = """
        import os, pathlib, sys, yaml
        pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "prefix.txt").write_text(sys.prefix)
    """
    spec = job_factory(script, "environment:\n  python: requirements\n")
    (spec.parent / "requirements.txt").write_text("pyyaml\n")
    job = broker.wait(broker.submit(spec).id, timeout_s=180)
    assert job.state == "accepted", job.reason
    prefix = (outputs(job.id) / "prefix.txt").read_text()
    assert prefix.startswith(str(paths.home() / "envs"))


def test_status_of_a_handle_from_another_process_sees_reused_pids(broker, job_factory):
    """A recorded pid that now belongs to another process (different start time) is not the job."""
    job = broker.wait(broker.submit(job_factory("print(1)\n")).id, timeout_s=60)
    workdir = paths.attempt_dir(job.id, 1)
    (workdir / "exit.json").unlink()
    record = json.loads((workdir / "supervisor.json").read_text())
    record["pid"] = os.getpid()  # alive, but started at another time
    (workdir / "supervisor.json").write_text(json.dumps(record))
    import asyncio

    from trainmaster.broker.planning.policy import load_policy

    local = broker.backend("local", load_policy())
    status = asyncio.run(local.status(Handle(backend="local", attempt_id=f"{job.id}.1", data={"workdir": str(workdir)})))
    assert status.phase.value == "failed" and "died" in status.reason


def test_gpu_requests_are_matched_against_the_machine():
    """Planning on a described machine (as hardware.this_machine reports it from NVML and torch.cuda)."""
    import asyncio

    from trainmaster.backends.base import OfferRequest
    from trainmaster.backends.hardware import Gpu, Machine
    from trainmaster.backends.local import LocalBackend
    from trainmaster.jobs.spec import JobSpec

    box = Machine(cpus=16, memory_mb=128_000, gpus=(Gpu(0, "NVIDIA A100-SXM4-40GB", 40_960), Gpu(1, "NVIDIA L4", 23_034)))
    local = LocalBackend(machine=box)

    def job(**res):
        return JobSpec(name="g", entrypoint="python t.py", resources=res)

    assert "needs 8 GPU(s); this machine has 2" in local.infeasible(job(gpus=8))[0]
    assert "of type H100" in local.infeasible(job(gpus=1, gpu_types=["H100"]))[0]
    assert "with ≥ 48 GB" in local.infeasible(job(gpus=1, min_vram_gb=48))[0]
    [offer] = asyncio.run(local.offers(OfferRequest(spec=job(gpus=1, gpu_types=["L4"])))).offers
    assert (offer.gpu_type, offer.gpu_count, offer.detail["gpu_indices"]) == ("NVIDIA L4", 1, [1])
    assert offer.price_per_hour_micro_usd == ((120 + 300) * 150_000 + 999) // 1000


def test_a_note_from_the_broker_is_appended_to_the_log_and_a_replaced_log_is_left_alone(tmp_path):
    """The broker's cost-cap stop says why in the run's log (broker/stages/watch.py); a log the job swapped for a
    link to a file of the user's is not written through."""
    import asyncio

    from trainmaster.backends.local.backend import LocalBackend
    from trainmaster.backends.local.config import LocalConfig

    backend = LocalBackend(LocalConfig())
    honest, hostile = tmp_path / "honest", tmp_path / "hostile"
    honest.mkdir(), hostile.mkdir()
    (honest / "job.log").write_text("[trainmaster] $ python train.py\n")
    victim = tmp_path / "users_file"
    victim.write_text("mine\n")
    (hostile / "job.log").symlink_to(victim)
    for workdir in (honest, hostile):
        asyncio.run(backend.note(Handle(backend="local", attempt_id="a1", data={"workdir": str(workdir)}), "cost cap reached: x"))
    assert (honest / "job.log").read_text().splitlines()[-1] == "[trainmaster] cost cap reached: x"
    assert victim.read_text() == "mine\n"

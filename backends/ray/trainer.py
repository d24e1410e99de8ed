"""The driver of a Ray job that spans nodes: `python -m trainmaster.backends.ray.trainer`, the entrypoint the Ray
backend submits when a job asks for `resources.nodes > 1` or for more GPUs than one node has.

It runs on the cluster inside the Ray job (its working directory holding the bundle, its `TRAINMASTER_LAUNCH`)
and runs Ray Train's `TorchTrainer` (Ray places and watches the workers; no scheduler of ours): one worker per
GPU, or per process of a CPU job. Each worker runs the shared launcher for its one process with torchrun's
variables mapped from Ray Train's context (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK,
GROUP_RANK, ROLE_RANK) and MASTER_ADDR/MASTER_PORT: rank 0's node and a port free there, broadcast by Ray
Train, where the entrypoint's own process group meets (Ray Train's own group, gloo, keeps its port). The launcher
checks the bundle's sha256 and runs the entrypoint directly; rank 0's keeps the synced folder on the cluster's
shared storage (outputs, checkpoints, log, exit record).

Ray Train retries nothing (`max_failures=0`: the policy retries, resuming from the synced checkpoints) and keeps
its run state under the run's `storage` folder. A launcher exiting non-zero fails its worker, so the run, and
the driver exits 1; a worker or its node lost fails the run before rank 0's launcher wrote its exit record,
which the backend reports as `lost`. Each launcher dies with the Ray worker that started it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from trainmaster.jobs.services import RAY_TRAIN_WORKER

RUN = "TRAINMASTER_RAY_TRAIN"
"""JSON: {"workers": n, "cpus": per worker, "gpus": per worker, "placement": Ray's strategy, "storage": Ray
Train's storage path, "name": the run's name}."""
STAY = "RAY_CHDIR_TO_TRIAL_DIR"
"""Ray Train moves each worker into a folder of its run unless this is 0."""
FAILED = 1
PR_SET_PDEATHSIG = 1


class LauncherFailed(Exception):
    """A worker's launcher exited non-zero (the job's own failure, or its bundle refused)."""


def main() -> int:
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchConfig, TorchTrainer

    run = json.loads(os.environ[RUN])
    os.environ[STAY] = "0"  # read as the trainer is made: the workers stay in the job's working dir (the bundle's)
    per_worker = {"CPU": run["cpus"], **({"GPU": run["gpus"]} if run["gpus"] else {})}
    trainer = TorchTrainer(
        worker,
        scaling_config=ScalingConfig(num_workers=run["workers"], use_gpu=bool(run["gpus"]),
                                     resources_per_worker=per_worker, placement_strategy=run["placement"]),
        run_config=RunConfig(name=run["name"], storage_path=run["storage"],
                             failure_config=FailureConfig(max_failures=0)),
        torch_config=TorchConfig(backend="gloo"),  # Ray Train's own group: never on the job's GPUs (no NCCL there)
    )
    try:
        trainer.fit()
    except TrainingFailedError as exc:
        print(f"[trainmaster] the Ray Train run failed: {exc}", file=sys.stderr, flush=True)
        return FAILED
    return 0


def worker() -> None:
    """One Ray Train worker: the shared launcher for this worker's process of the job."""
    from ray.train import get_context
    from ray.train.collective import broadcast_from_rank_zero

    ctx = get_context()
    rank = ctx.get_world_rank()
    addr, port = broadcast_from_rank_zero(rendezvous() if rank == 0 else None)
    ranks = {"RANK": rank, "LOCAL_RANK": ctx.get_local_rank(), "WORLD_SIZE": ctx.get_world_size(),
             "LOCAL_WORLD_SIZE": ctx.get_local_world_size(), "NODE_RANK": ctx.get_node_rank(),
             "GROUP_RANK": ctx.get_node_rank(), "ROLE_RANK": rank, "MASTER_ADDR": addr, "MASTER_PORT": port}
    env = {**os.environ, **{k: str(v) for k, v in ranks.items()}, RAY_TRAIN_WORKER: "1"}
    code = subprocess.call([sys.executable, "-m", "trainmaster.jobs.launcher"], env=env, stdin=subprocess.DEVNULL,
                           preexec_fn=die_with_worker if sys.platform.startswith("linux") else None)
    if code:
        raise LauncherFailed(f"rank {rank}: the launcher exited with code {code}")


def rendezvous() -> tuple[str, int]:
    """This node's address as the cluster knows it (`ray start --node-ip-address`) and a port free on it: where
    the entrypoint's process group meets."""
    import ray

    addr = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind((addr, 0))
        return addr, s.getsockname()[1]


def die_with_worker() -> None:
    """In the launcher before it starts (Linux): killed with the Ray worker that runs it (a stopped job's)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())

"""The driver of a Ray job that spans several nodes: `python -m trainmaster.backends.ray.gang`, the entrypoint the
Ray backend submits when a job asks for `resources.nodes > 1`.

It runs on the cluster (inside the Ray job: its working directory, its `TRAINMASTER_LAUNCH`), reserves one
bundle of the job's per-node resources on each of that many distinct nodes (a STRICT_SPREAD placement group),
asks node 0 for its address and a free port, and runs the shared launcher on every node as a Ray task with
`NODE_RANK`, `MASTER_ADDR` and `MASTER_PORT` set: torchrun's rendezvous across the nodes, node 0 keeping the
synced folder (jobs/services.py, the `ray` service). It exits with node 0's launcher's exit code, or the first
other node's non-zero one. A node lost fails its task and so the driver, before node 0 writes its exit record:
the backend reports the attempt `lost`. Each launcher dies with the Ray worker that started it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from trainmaster.jobs.launch_plan import VARIABLE, LaunchPlan

RESOURCES = "TRAINMASTER_RAY_NODE_RESOURCES"
"""JSON: what each node's bundle reserves ({"CPU": n, "GPU": g})."""
READY_S = 600
PR_SET_PDEATHSIG = 1


def main() -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    plan = LaunchPlan.model_validate_json(os.environ[VARIABLE])
    per_node = json.loads(os.environ[RESOURCES])
    ray.init()
    group = placement_group([per_node] * plan.nodes, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=READY_S)

    def on(index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)

    where = ray.remote(num_cpus=0)(rendezvous).options(scheduling_strategy=on(0)).remote()
    addr, port = ray.get(where)
    launch = ray.remote(num_cpus=per_node.get("CPU", 0), num_gpus=per_node.get("GPU", 0))(launcher)
    runs = [launch.options(scheduling_strategy=on(rank)).remote(rank, addr, port) for rank in range(plan.nodes)]
    codes = ray.get(runs)
    return codes[0] or next((code for code in codes if code), 0)


def rendezvous() -> tuple[str, int]:
    """This node's address as the cluster knows it (`ray start --node-ip-address`) and a free port on it (node 0's:
    where torchrun's rendezvous listens)."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    addr = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == here)
    with socket.socket() as s:
        s.bind((addr, 0))
        return addr, s.getsockname()[1]


def launcher(rank: int, addr: str, port: int) -> int:
    """The shared launcher as node `rank`; its exit code."""
    env = {**os.environ, "NODE_RANK": str(rank), "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
    return subprocess.call([sys.executable, "-m", "trainmaster.jobs.launcher"], env=env, stdin=subprocess.DEVNULL,
                           preexec_fn=die_with_worker if sys.platform.startswith("linux") else None)


def die_with_worker() -> None:
    """In the launcher before it starts (Linux): killed with the Ray worker that runs it (a stopped job's)."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())

"""Where each training service puts a job's inputs inside its container, read from the service's own variables.

The container launcher (jobs/launcher.py) asks `place(plan, environ)` for a :class:`Placement`: the bundle
file, the synced folder, the service's model folder, and this machine's place among the job's machines
(node rank, how many, where node 0 listens). What each service sets:

* SageMaker (its training container contract, with a ContainerEntrypoint: no SM_* variables, which come from
  the sagemaker-training toolkit an entrypoint bypasses): the bundle is the one file of the `bundle` channel
  (/opt/ml/input/data/bundle); the synced folder is the checkpoint LocalPath (/opt/ml/checkpoints); the model
  folder /opt/ml/model; the hosts and this one are `hosts` and `current_host` of
  /opt/ml/input/config/resourceconfig.json; node 0 is the first host (algo-1), where torchrun meets.
* Vertex AI: buckets are read through the Cloud Storage FUSE mount (`TRAINMASTER_GCS_MOUNT`, `/gcs`): a
  `gs://B/K` is `/gcs/B/K`. The synced folder is `AIP_CHECKPOINT_DIR`, the model folder `AIP_MODEL_DIR`; the
  machines are `CLUSTER_SPEC` (workerpool0 is node 0, workerpool1's index i is node 1 + i).
* Azure ML: the bundle is the `bundle` input (a file, or a folder holding one), the synced folder the `sync`
  output; its PyTorch distribution (one process per instance) sets `MASTER_ADDR`, `MASTER_PORT`, `NODE_RANK`.
* Ray (the Jobs API): the bundle is a file of the job's working directory (Ray unpacks it and starts the
  launcher there), named by the plan; the synced folder is the plan's, under the cluster's shared storage
  path. A job on one node has the launcher as its entrypoint. Across nodes each Ray Train worker runs a
  launcher for one process (`TRAINMASTER_RAY_TRAIN_WORKER` set, backends/ray/trainer.py) with torchrun's
  variables already set: the entrypoint runs directly with them (`ranks`), and the process of rank 0 keeps the
  synced folder.

Everywhere `MASTER_ADDR` and `MASTER_PORT` set by the service win over the derived ones; the port is
otherwise the plan's. A plan's own `bundle` or `sync` wins over the service's input. Standard library and the
plan only: the launcher starts in a fraction of a second.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainmaster.jobs.launch_plan import LaunchPlan

OPT_ML_ROOT = Path("/opt/ml")
GCS_MOUNT = "TRAINMASTER_GCS_MOUNT"
RAY_TRAIN_WORKER = "TRAINMASTER_RAY_TRAIN_WORKER"
"""Set (to 1) by a Ray Train worker in the launcher it starts: one process of the job, its ranks in RANKS."""
RANKS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "ROLE_RANK",
         "MASTER_ADDR", "MASTER_PORT")


class PlacementError(Exception):
    """The service's variables do not say where something is; the message names what is missing."""


@dataclass(frozen=True)
class Placement:
    bundle: Path
    sync: Path
    model_dir: Path | None
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    ranks: Mapping[str, str] = field(default_factory=dict)
    """torchrun's variables of the one process this launcher runs when the service started a launcher per
    process (Ray Train's workers); empty when the launcher starts the node's processes itself."""

    @property
    def lead(self) -> bool:
        """Whether this launcher keeps the synced folder: node 0's, or rank 0's when it runs one process."""
        return self.ranks["RANK"] == "0" if self.ranks else self.node_rank == 0


def place(plan: LaunchPlan, environ: Mapping[str, str]) -> Placement:
    """Where this container finds what `plan` names, and its place among the job's machines."""
    found = {"sagemaker": _sagemaker, "vertex": _vertex, "azureml": _azureml, "ray": _ray}[plan.service](plan, environ)
    addr = environ.get("MASTER_ADDR") or found["master_addr"]
    port = _port(environ.get("MASTER_PORT") or found.get("master_port") or plan.master_port)
    if not 0 <= found["node_rank"] < found["nnodes"]:
        raise PlacementError(f"node rank {found['node_rank']} is outside the job's {found['nnodes']} node(s)")
    return Placement(bundle=found["bundle"], sync=found["sync"], model_dir=found["model_dir"],
                     nnodes=found["nnodes"], node_rank=found["node_rank"], master_addr=addr, master_port=port,
                     ranks=found.get("ranks", {}))


def _sagemaker(plan: LaunchPlan, environ: Mapping[str, str]) -> dict:
    opt_ml = OPT_ML_ROOT
    config = _json_file(opt_ml / "input" / "config" / "resourceconfig.json")
    hosts, current = config.get("hosts"), config.get("current_host")
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) and h for h in hosts):
        raise PlacementError(f"resourceconfig.json: hosts is not a list of host names: {hosts!r}")
    if current not in hosts:
        raise PlacementError(f"resourceconfig.json: current_host {current!r} is not one of its hosts {hosts!r}")
    ordered = sorted(hosts, key=_host_order)  # algo-1, algo-2, …, algo-10: node 0 is algo-1 on every host
    channel = opt_ml / "input" / "data" / "bundle"
    return {"bundle": Path(plan.bundle) if plan.bundle else _only_file(channel, "the bundle channel"),
            "sync": Path(plan.sync) if plan.sync else opt_ml / "checkpoints", "model_dir": opt_ml / "model",
            "nnodes": len(ordered), "node_rank": ordered.index(current), "master_addr": ordered[0]}


def _host_order(host: str) -> tuple:
    """SageMaker's hosts in their natural order (algo-2 before algo-10)."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", host))


def _json_file(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlacementError(f"{path} cannot be read: {exc}") from exc
    if not isinstance(found, dict):
        raise PlacementError(f"{path} is not a JSON object")
    return found


def _vertex(plan: LaunchPlan, environ: Mapping[str, str]) -> dict:
    mount = Path(environ.get(GCS_MOUNT, "/gcs"))
    sync = plan.sync or environ.get("AIP_CHECKPOINT_DIR", "")
    if not plan.bundle or not sync:
        raise PlacementError("Vertex AI: the plan names no bundle" if not plan.bundle else
                             "Vertex AI: neither the plan nor AIP_CHECKPOINT_DIR names the synced folder")
    model = environ.get("AIP_MODEL_DIR")
    found = {"bundle": _mounted(plan.bundle, mount), "sync": _mounted(sync, mount),
             "model_dir": _mounted(model, mount) if model else None}
    if "CLUSTER_SPEC" not in environ:
        return {**found, "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1"}
    spec = _json(environ, "CLUSTER_SPEC", "{}")
    try:
        cluster, task = spec["cluster"], spec["task"]
        host, _, port = cluster["workerpool0"][0].partition(":")
        others = cluster.get("workerpool1", [])
        rank = 0 if task["type"] == "workerpool0" else 1 + int(task["index"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise PlacementError(f"CLUSTER_SPEC lacks the cluster's workerpool0 or this task ({exc!r})") from exc
    return {**found, "nnodes": 1 + len(others), "node_rank": rank, "master_addr": host, "master_port": port or None}


def _azureml(plan: LaunchPlan, environ: Mapping[str, str]) -> dict:
    bundle, sync = plan.bundle or environ.get("AZURE_ML_INPUT_bundle"), plan.sync or environ.get("AZURE_ML_OUTPUT_sync")
    if not bundle or not sync:
        raise PlacementError(f"Azure ML: {'AZURE_ML_INPUT_bundle' if not bundle else 'AZURE_ML_OUTPUT_sync'} is not set")
    path = Path(bundle)
    return {"bundle": _only_file(path, "AZURE_ML_INPUT_bundle") if path.is_dir() else path, "sync": Path(sync),
            "model_dir": None, "nnodes": plan.nodes, "node_rank": _int(environ.get("NODE_RANK", "0"), "NODE_RANK"),
            "master_addr": "127.0.0.1"}


def _ray(plan: LaunchPlan, environ: Mapping[str, str]) -> dict:
    if not plan.bundle or not plan.sync:
        raise PlacementError(f"Ray: the plan names no {'bundle' if not plan.bundle else 'synced folder'}")
    found = {"bundle": Path(plan.bundle).absolute(), "sync": Path(plan.sync), "model_dir": None, "nnodes": plan.nodes,
             "node_rank": _int(environ.get("NODE_RANK", "0"), "NODE_RANK"), "master_addr": "127.0.0.1"}
    if environ.get(RAY_TRAIN_WORKER) != "1":
        return found
    missing = [name for name in RANKS if not environ.get(name)]
    if missing:
        raise PlacementError(f"Ray Train worker: {', '.join(missing)} not set")
    ranks = {name: environ[name] for name in RANKS}
    for name in RANKS[:-2]:
        _int(ranks[name], name)
    # a job of more GPUs than one node has spans nodes though it asked for one
    return {**found, "nnodes": max(plan.nodes, found["node_rank"] + 1), "ranks": ranks}


def _mounted(uri: str, mount: Path) -> Path:
    """A `gs://B/K` URI as its path under the Cloud Storage FUSE mount; a path as it is."""
    return mount / uri.removeprefix("gs://") if uri.startswith("gs://") else Path(uri)


def _only_file(folder: Path, variable: str) -> Path:
    """The one file of an input folder (a SageMaker channel, an Azure ML folder input)."""
    try:
        files = [p for p in folder.iterdir() if p.is_file()]
    except OSError as exc:
        raise PlacementError(f"{variable}: cannot list {folder}: {exc.strerror}") from exc
    if len(files) != 1:
        raise PlacementError(f"{variable}: {folder} holds {len(files)} files, not the bundle alone")
    return files[0]


def _json(environ: Mapping[str, str], name: str, default: str):
    try:
        return json.loads(environ.get(name, default))
    except ValueError as exc:
        raise PlacementError(f"{name} is not JSON: {exc}") from exc


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise PlacementError(f"{name} is not a number: {value!r}") from exc


def _port(value) -> int:
    port = _int(str(value), "MASTER_PORT")
    if not 1 <= port <= 65535:
        raise PlacementError(f"MASTER_PORT {port} is not a TCP port")
    return port

"""The Ray backend: a job runs on one or several nodes of your own Ray cluster through the Jobs API, priced by the
power model.

Submit: the bundle, alone in a folder of the attempt's work dir, is the job's `working_dir` (Ray uploads it
to the cluster); the entrypoint is the shared launcher (`python -m trainmaster.jobs.launcher`, the `ray`
service of jobs/launch_plan.py), which checks the bundle's sha256 on the node before the job starts. The
submission id derives from the attempt id, so a second submit finds the first job. A job of several nodes, or
of more GPUs than one node has free, is submitted as the Ray Train driver (trainer.py): Ray Train's
`TorchTrainer` runs one worker per GPU, or per process of a CPU job, each starting the launcher for its one
process with torchrun's rank variables. The synced folder is
`<storage_path>/attempts/<attempt id>/` on the cluster's shared storage, which this machine sees at the same
path: the launcher (rank 0's) keeps the outputs, checkpoints, log and exit record there, and status, logs,
metrics, the resume point and the outputs are read from it, as the managed backends read theirs from an
object store. Ray Train keeps its own run state under `<storage_path>/ray-train/<attempt id>`.

States: Ray's PENDING/RUNNING/SUCCEEDED map to ours, STOPPED to cancelled; a FAILED job whose launcher wrote
its exit record failed with the job's own exit code (the script failed); one without it never finished (its
node or its driver died): `lost`, so the policy retries it, resuming from the synced checkpoints. Offers come
from what the cluster's live nodes have free (the dashboard's REST API, with a timeout): a busy cluster offers
less, and one that does not answer has no offers and says why, so the plan falls back.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, BackendError, Cause, Cost, Handle, LogChunk, Offer, OfferRequest,
    OfferSet, OutputFile, Phase, Progress,
)
from trainmaster.backends.features import (
    CheckpointRef, KeepsSegments, MetricsChunk, ReportsMetrics, ResumesFromCheckpoints, SupportsMultiGpu,
    SupportsMultiNode,
)
from trainmaster.backends.segments import copy_segments, newest_segment
from trainmaster.backends.ray import check
from trainmaster.backends.ray.cluster import Jobs, Node, RayJob, nodes
from trainmaster.backends.ray.config import RayConfig
from trainmaster.backends.ray.trainer import RUN
from trainmaster.jobs import launch_plan as plan
from trainmaster.jobs.bundle import BundleError, read_member
from trainmaster.jobs.environment import BUNDLE_SHA256, JOB_ID, SEED, spec_checkpoint_environment
from trainmaster.jobs.files import HostileFile, read_regular
from trainmaster.jobs.metrics import FILENAME as METRICS_FILE
from trainmaster.jobs.spec import JobSpec

BUNDLE_NAME = "bundle.tar"
LOG_CHUNK = 2**20
MAX_RECORD_BYTES = 2**16
MAX_MANIFEST_BYTES = 2**24
CANCEL_WAIT_S = 30.0
OMP_THREADS = "OMP_NUM_THREADS"
"""Ray sets it to the CPUs a job holds, for every process: with several processes per node that oversubscribes
the CPUs (13× slower DDP steps measured with 2 processes on 2 CPUs), so each process gets its share (the
spec's `env` wins)."""
POLL_S = 0.2
MAX_REQUIREMENTS_BYTES = 2**20
RAY_PIP_OPTIONS = ("--disable-pip-version-check", "--no-cache-dir")
"""Ray's own pip options, which a runtime environment's `pip_install_options` replaces."""


class RayBackend(SupportsMultiGpu, SupportsMultiNode, KeepsSegments, ResumesFromCheckpoints, ReportsMetrics, Backend):
    name = "ray"
    unsupported = {
        "spot": "your own machines are never preempted, so there is no spot price",
        "remote_data": "reads paths on the cluster's nodes only; copy s3://, gs:// or az:// data down first",
    }
    config_model = RayConfig
    config: RayConfig
    exact_replay = False  # the nodes may differ from this machine: a replay audit of a Ray job is within τ

    def __init__(self, config: RayConfig | None = None):
        super().__init__(config)
        self.jobs = Jobs(self.config.address, self.config.timeout_s)

    # planning

    async def offers(self, request: OfferRequest) -> OfferSet:
        spec = request.spec
        reasons = check.check(self.config)
        if reasons:
            return OfferSet(backend=self.name, reasons=reasons)
        try:
            live = await nodes(self.config.address, self.config.timeout_s)
        except BackendError as exc:
            return OfferSet(backend=self.name, reasons=[str(exc)])
        fitting = sorted((n for n in live if not _misfit(n, spec)), key=lambda n: (n.gpus, n.cpus, n.memory_mb))
        spans = _spans(live, spec) if spec.resources.nodes == 1 and not fitting else []
        if len(fitting) < spec.resources.nodes and not spans:
            return OfferSet(backend=self.name, reasons=[_no_node(live, spec)])
        node = fitting[-spec.resources.nodes] if not spans else max(spans, key=lambda n: n.gpus)
        gpus = spec.resources.gpus
        return OfferSet(backend=self.name, offers=[Offer(
            backend=self.name, instance=f"ray@{urlsplit(self.config.address).hostname}", region="ray",
            gpu_type=node.gpu_type if gpus else None, gpu_count=gpus, cpus=node.cpus, memory_mb=node.memory_mb,
            nodes=spec.resources.nodes,
            price_per_hour_micro_usd=self.config.power.price_per_hour_micro(gpus),
            detail={"nodes": len(live), "fitting_nodes": len(fitting), "nproc": spec.resources.nproc,
                    "ray_train": spec.resources.nodes > 1 or bool(spans)},
            quote={"source": "power model"},
        )])

    # running

    def sync_folder(self, attempt_id: str) -> Path:
        if not self.config.storage_path:
            raise BackendError("ray.storage_path is not set in backends.yaml")
        return Path(self.config.storage_path) / "attempts" / attempt_id

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        sync = self.sync_folder(ctx.attempt_id)
        working_dir = Path(ctx.workdir) / "ray"
        await asyncio.to_thread(_prepare, bundle, working_dir, sync, Path(ctx.resume_from) if ctx.resume_from else None)
        submission, res = "tm-" + ctx.attempt_id, spec.resources
        env = {plan.VARIABLE: self._plan(spec, ctx, sync).model_dump_json()}
        if self.config.namespace:
            env["RAY_NAMESPACE"] = self.config.namespace
        pip = await asyncio.to_thread(self._pip, bundle, spec)
        # with requirements, `python` is the runtime environment's (a virtualenv over the node's interpreter)
        python = "python" if pip else shlex.quote(self.config.python)
        if not offer.detail.get("ray_train"):  # the launcher is the entrypoint, holding the job's resources
            entry, cpus, gpus = f"{python} -m trainmaster.jobs.launcher", node_cpus(spec), res.gpus
        else:  # the Ray Train driver holds nothing; each worker holds its process's share (trainer.py)
            entry, cpus, gpus = f"{python} -m trainmaster.backends.ray.trainer", 0, 0
            env[RUN] = json.dumps(self._run(spec, ctx.attempt_id))
        await asyncio.to_thread(self.jobs.submit, submission, entrypoint=entry, working_dir=str(working_dir), env=env,
                                cpus=cpus, gpus=gpus, pip=pip)
        return Handle(backend=self.name, attempt_id=ctx.attempt_id,
                      data={"submission": submission, "sync": str(sync), "nodes": res.nodes})

    def _pip(self, bundle: Path, spec: JobSpec) -> dict | None:
        """Ray's `pip` runtime environment for an `environment: requirements` job (None for `current`): the
        requirements file's lines, read from the bundle, and the configured pip options."""
        if spec.environment.python != "requirements":
            return None
        try:
            text = read_member(bundle, spec.environment.requirements, MAX_REQUIREMENTS_BYTES).decode()
        except (BundleError, UnicodeDecodeError) as exc:
            raise BackendError(f"cannot read the job's requirements from its bundle: {exc}") from None
        lines = [line.split(" #")[0].strip() for line in text.splitlines()]
        return {"packages": [line for line in lines if line and not line.startswith("#")],
                "pip_install_options": [*RAY_PIP_OPTIONS, *self.config.pip_install_options]}

    def _run(self, spec: JobSpec, attempt_id: str) -> dict:
        """The Ray Train run of a job across nodes: one worker per process (per GPU, or per process on CPU),
        each holding its share of a node's resources; one worker per node when the job runs one process per node
        (STRICT_SPREAD), else spread as Ray can (SPREAD) or, for GPUs beyond one node, packed (PACK)."""
        res = spec.resources
        placement = ("STRICT_SPREAD" if res.nproc == 1 else "SPREAD") if res.nodes > 1 else "PACK"
        return {"workers": res.nodes * res.nproc, "cpus": max(1, node_cpus(spec) // res.nproc),
                "gpus": res.gpus / res.nproc if res.gpus else 0, "placement": placement,
                "storage": str(Path(self.config.storage_path) / "ray-train"), "name": attempt_id}

    @staticmethod
    def _plan(spec: JobSpec, ctx: AttemptContext, sync: Path) -> plan.LaunchPlan:
        return plan.LaunchPlan(
            service="ray", entrypoint=spec.entrypoint, launcher=spec.launcher, nproc=spec.resources.nproc,
            nodes=spec.resources.nodes,
            bundle=BUNDLE_NAME, bundle_sha256=ctx.bundle_sha256, sync=str(sync),
            env={OMP_THREADS: str(max(1, node_cpus(spec) // spec.resources.nproc)), **spec.env, JOB_ID: ctx.job_id,
                 SEED: str(ctx.seed), **spec_checkpoint_environment(spec.checkpoint),
                 BUNDLE_SHA256: ctx.bundle_sha256, "PYTHONUNBUFFERED": "1"},
        )

    async def _job(self, handle: Handle) -> RayJob:
        return await self.jobs.info(handle.data["submission"])

    async def status(self, handle: Handle) -> AttemptStatus:
        job = await self._job(handle)
        ended = await asyncio.to_thread(_record, Path(handle.data["sync"]) / plan.SYNC_EXIT, MAX_RECORD_BYTES)
        return _status(job, ended)

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        done = (await self._job(handle)).status in ENDED  # before the log: nothing written after it is missed
        chunk = await asyncio.to_thread(MetricsChunk.from_file, Path(handle.data["sync"]) / plan.SYNC_LOG, offset, LOG_CHUNK + 1)
        data = chunk.data[:LOG_CHUNK]
        return LogChunk(text=data.decode(errors="replace"), offset=offset, next_offset=offset + len(data),
                        complete=done and len(chunk.data) <= LOG_CHUNK)

    async def metrics(self, handle: Handle, offset: int = 0, limit: int = 2**16) -> MetricsChunk:
        path = Path(handle.data["sync"]) / plan.SYNC_OUTPUTS / METRICS_FILE
        return await asyncio.to_thread(MetricsChunk.from_file, path, offset, limit)

    async def cancel(self, handle: Handle) -> int | None:
        """Ask Ray to stop the job and wait (bounded) until it has: Ray sends SIGTERM to the launcher, which
        passes it to the job, then SIGKILL past its grace, which takes the job's process with the launcher."""
        submission = handle.data["submission"]
        await self.jobs.stop(submission)
        deadline = time.monotonic() + CANCEL_WAIT_S
        while (await self._job(handle)).status not in ENDED and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        return None

    async def last_checkpoint(self, handle: Handle) -> CheckpointRef | None:
        """The attempt's synced folder, once its checkpoints hold a segment whose manifest reads."""
        sync = Path(handle.data["sync"])
        newest = await asyncio.to_thread(newest_segment, sync / plan.SYNC_CHECKPOINTS)
        return CheckpointRef(uri=str(sync), segment=newest[0], step=newest[1]) if newest else None

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path) -> Path:
        """For the replay audit: the segments it challenges (and every manifest) copied from the synced
        checkpoints into the broker's `dest`, hashed as they go."""
        return await copy_segments(Path(handle.data["sync"]) / plan.SYNC_CHECKPOINTS, indices, Path(dest))

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        """The outputs from the synced folder, hashed as they are copied, checked against the launcher's manifest
        (sizes and sha256 it took on the node); a disagreement is refused and nothing is kept."""
        if dest.exists():
            return transfer.list_files(dest)
        sync = Path(handle.data["sync"])
        manifest = await asyncio.to_thread(_manifest, sync)
        files = await transfer.copy_tree(sync / plan.SYNC_OUTPUTS, dest, progress, link=False)
        got = {f.path: (f.size, f.sha256) for f in files}
        if got != manifest:
            await asyncio.to_thread(shutil.rmtree, dest, True)
            differ = sorted(p for p in set(got) | set(manifest) if got.get(p) != manifest.get(p))
            raise BackendError(f"the outputs in {sync / plan.SYNC_OUTPUTS} differ from the launcher's manifest "
                               f"({', '.join(differ[:5])})")
        return files

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        job = await self._job(handle)
        if job.started_at is None:
            return Cost(micro_usd=0, billable_seconds=0, basis="never started")
        seconds = max(0.0, (job.ended_at or time.time()) - job.started_at)
        price, nodes = offer.price_per_hour_micro_usd, int(handle.data.get("nodes", 1))
        micro = -(-int(seconds * 1000) * nodes * price // 3_600_000)  # rounded up to the micro-dollar
        return Cost(micro_usd=micro, billable_seconds=seconds * nodes,
                    basis=f"{seconds:.1f} s (the Ray job's run time) × {nodes} node(s) × {price} µUSD/h (power model)")


ENDED = ("STOPPED", "SUCCEEDED", "FAILED")
PHASES = {"PENDING": Phase.pending, "RUNNING": Phase.running, "SUCCEEDED": Phase.succeeded,
          "STOPPED": Phase.cancelled, "FAILED": Phase.failed}


def _status(job: RayJob, ended: dict | None) -> AttemptStatus:
    """Our state of a Ray job, with the launcher's exit record (None until it wrote one)."""
    phase = PHASES.get(job.status, Phase.pending)
    found = AttemptStatus(phase=phase, started_at=job.started_at, ended_at=job.ended_at if phase.done else None)
    if phase is Phase.cancelled:
        return found.model_copy(update={"cause": Cause.cancelled, "reason": "stopped through the Ray Jobs API"})
    code = ended.get("exit_code") if ended else None
    if phase is Phase.succeeded:
        return found.model_copy(update={"exit_code": code if isinstance(code, int) else 0})
    if phase is not Phase.failed:
        return found
    if isinstance(code, int) and not isinstance(code, bool):
        return found.model_copy(update={"cause": Cause.script_failed, "exit_code": code,
                                        "reason": str(ended.get("reason") or f"exited with code {code}")[:2000]})
    why = job.message.strip().splitlines()[0] if job.message.strip() else "no reason given"
    return found.model_copy(update={"cause": Cause.lost, "reason": f"the job ended without the launcher's exit "
                                                                   f"record (its node or driver died): Ray says "
                                                                   f"{job.error_type or 'FAILED'}: {why}"[:2000]})


def node_cpus(spec: JobSpec) -> int:
    """The CPUs a job holds on each of its nodes: its `cpus`, and one per process of a CPU job."""
    res = spec.resources
    return max(res.cpus, 1 if res.gpus else res.nproc)


def _misfit(node: Node, spec: JobSpec) -> str | None:
    """Why `node` cannot run `spec` (None when it can)."""
    res = spec.resources
    if res.gpus > node.gpus:
        return f"{node.gpus} GPU(s)"
    if res.gpus and res.gpu_types and node.gpu_type not in res.gpu_types:
        return f"GPUs of type {node.gpu_type or 'unknown'}"
    if node_cpus(spec) > node.cpus:
        return f"{node.cpus} CPU(s)"
    if res.memory_gb and res.memory_gb * 1024 > node.memory_mb:
        return f"{node.memory_mb // 1024} GB of memory"
    return None


def _spans(live: list[Node], spec: JobSpec) -> list[Node]:
    """The nodes (of a wanted GPU type) that together hold the workers of a one-node job asking for more GPUs than
    any one node has free: one worker per process, each with its share of the GPUs and CPUs (Ray Train runs them
    across the nodes); empty when they cannot."""
    res = spec.resources
    if not res.gpus:
        return []
    gpus, cpus = res.gpus / res.nproc, max(1, node_cpus(spec) // res.nproc)
    typed = [n for n in live if not res.gpu_types or n.gpu_type in res.gpu_types]
    return typed if sum(min(int(n.gpus // gpus), n.cpus // cpus) for n in typed) >= res.nproc else []


def _no_node(live: list[Node], spec: JobSpec) -> str:
    if not live:
        return "the Ray cluster has no live node"
    res = spec.resources
    need = (f"{res.gpus} GPU(s)" + (f" of type {'/'.join(res.gpu_types)}" if res.gpu_types else "") + ", "
            if res.gpus else "") + f"{node_cpus(spec)} CPU(s)"
    have = "; ".join(f"{n.ip}: {_misfit(n, spec)} free" for n in live[:5])
    many = f"{res.nodes} nodes" if res.nodes > 1 else "no node"
    return f"{many} of the Ray cluster {'have' if res.nodes > 1 else 'has'} {need} (nodes have {have})"


def _prepare(bundle: Path, working_dir: Path, sync: Path, resume_from: Path | None) -> None:
    """The job's working dir (the bundle alone) and its synced folder, the resumed attempt's checkpoints and
    metrics carried in the first time (a submit repeated after a crash leaves them as they are)."""
    working_dir.mkdir(parents=True, exist_ok=True)
    target = working_dir / BUNDLE_NAME
    if not target.exists():
        shutil.copyfile(bundle, target.with_suffix(".part"))
        os.replace(target.with_suffix(".part"), target)
    carried = resume_from / plan.SYNC_CHECKPOINTS if resume_from is not None else None
    if carried is not None and carried.is_dir() and not (sync / plan.SYNC_CHECKPOINTS).exists():
        shutil.copytree(carried, sync / plan.SYNC_CHECKPOINTS, symlinks=True)
        metrics = resume_from / plan.SYNC_OUTPUTS / METRICS_FILE
        if metrics.is_file():
            (sync / plan.SYNC_OUTPUTS).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(metrics, sync / plan.SYNC_OUTPUTS / METRICS_FILE)
    sync.mkdir(parents=True, exist_ok=True)


def _record(path: Path, limit: int) -> dict | None:
    """A JSON record of the synced folder, read bounded and never through a link; None when missing or unreadable."""
    try:
        found = json.loads(read_regular(path, limit))
    except (OSError, ValueError, HostileFile):
        return None
    return found if isinstance(found, dict) else None


def _manifest(sync: Path) -> dict[str, tuple[int, str]]:
    found = _record(sync / plan.SYNC_MANIFEST, MAX_MANIFEST_BYTES)
    if found is None:
        raise BackendError(f"no output manifest in {sync}: the launcher did not finish (see the attempt's log)")
    try:
        return {str(p): (int(v["size"]), str(v["sha256"])) for p, v in found["files"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BackendError(f"the output manifest does not read: {exc}") from None

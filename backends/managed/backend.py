"""One backend over a managed training service and its object store (SageMaker + S3, Vertex AI + GCS, Azure ML
+ Blob): the clouds differ only in their `TrainingService` and `ObjectStore` (each in its own folder).

An attempt lives under `attempts/<attempt id>/` in the store. Its `input/` folder is what the container reads
first: the boot script, the launch plan (`launch.json`) and the runtime pack (backends/managed/runtime_pack.py:
trainmaster itself, shipped with the job since no image has it), with the backend's `setup` as `setup.sh` when
there is one. The service carries the container's synced folder there (jobs/launch_plan.py: the outputs, the
checkpoints, the log parts and the exit record node 0's launcher publishes), so status, logs, metrics, the
resume point and the outputs are read from the store, the same way on every cloud, while the job runs. The bundle
and the runtime pack are stored once under their sha256 (`bundles/<sha256>.tar`, `runtime/<sha256>.zip`), so
one already there is not sent again. The job's name comes from the attempt id (backends/managed/names.py).

Resuming: a re-submitted attempt gets the previous attempt's checkpoints (and its metrics) copied, on the
store's side, into its own synced folder before its job starts; the launcher resumes from whatever complete
segment it finds there, which is also how a service's own restart of a spot job (its checkpoints restored)
resumes. Cost is the price recorded at dispatch × the billable seconds the service reports (or what its job
resource documents, named in the basis) × instances, plus the estimated egress of fetching the outputs and the
storage they took, each named in the basis.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import ClassVar

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, BackendError, Cause, Cost, ExecutorFault, Handle, LogChunk, Offer,
    OfferRequest, OfferSet, OutputFile, Phase, Progress,
)
from trainmaster.backends.catalog.offers import catalog_offers
from trainmaster.backends.catalog.transfer import EGRESS_MICRO_USD_PER_GB
from trainmaster.backends.features import (
    CheckpointRef, MetricsChunk, ReportsMetrics, ResumesFromCheckpoints, SupportsMultiGpu, SupportsMultiNode,
    SupportsRemoteData, SupportsSpot,
)
from trainmaster.backends.managed import runtime_pack
from trainmaster.backends.managed.config import ManagedConfig
from trainmaster.backends.managed.names import job_name
from trainmaster.backends.managed.training_service import ServiceJob, ServiceState, TrainingService
from trainmaster.backends.object_store import ObjectStore
from trainmaster.backends.time_limit import max_seconds
from trainmaster.jobs import launch_plan as plan
from trainmaster.jobs.environment import BUNDLE_SHA256, JOB_ID, SEED, spec_checkpoint_environment
from trainmaster.jobs.metrics import FILENAME as METRICS_FILE
from trainmaster.jobs.spec import JobSpec

LOG_CHUNK = 2**20
LOG_PARTS = "log/"
"""The log's parts under the synced folder (jobs/launcher_publish.LOG_FOLDER)."""
MAX_RECORD_BYTES = 2**16
MAX_MANIFEST_BYTES = 2**24
"""The outputs' manifest lists every output file (~150 bytes each): room for ~100,000 of them."""
STORAGE_MICRO_USD_PER_GB_MONTH = 23_000
"""Standard object storage, about $0.023 per GB-month on all three clouds: the estimate of what an attempt's
files cost while they are kept."""
MAX_SEEN = 4096
INPUT = "input"
"""The attempt's input folder in the store (`attempts/<id>/input/`): what the container reads first."""


class ManagedBackend(SupportsMultiGpu, SupportsMultiNode, SupportsSpot, SupportsRemoteData, ResumesFromCheckpoints,
                     ReportsMetrics, Backend):
    """Remote data (`s3://`, `gs://`, `az://` in the spec's `data`) is read by the job itself inside the cloud,
    with the service's role; the planner prices its egress when it lies in another cloud."""
    service_name: ClassVar[str]
    """The launcher's name for the service (jobs/launch_plan.SERVICES)."""
    default_python: ClassVar[str] = "3.11"
    """The Python of the service's default image (what pydantic-core is packed for when `image` is not set)."""
    config_model = ManagedConfig
    config: ManagedConfig

    def __init__(self, config: ManagedConfig | None = None):
        super().__init__(config)
        self._store: ObjectStore | None = None
        self._service: TrainingService | None = None
        self._seen: dict[str, tuple[float, ServiceState]] = {}

    # what each cloud provides

    def make_store(self) -> ObjectStore:
        raise NotImplementedError

    def make_service(self) -> TrainingService:
        raise NotImplementedError

    def default_image(self, offer: Offer) -> str:
        raise NotImplementedError

    def regions(self) -> list[str] | None:
        """The regions this backend creates jobs in (its configured one), None when any catalog region goes."""
        return None

    def sync_key(self, attempt_id: str) -> str:
        """The attempt's synced folder in the store (Vertex AI fixes it as `<its output folder>/checkpoints/`)."""
        return f"attempts/{attempt_id}/sync/"

    # shared

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = self.make_store()
        return self._store

    @property
    def service(self) -> TrainingService:
        if self._service is None:
            self._service = self.make_service()
        return self._service

    async def describe(self, name: str) -> ServiceState:
        """The service's state of a job, asked at most every `poll_s` while it runs (the broker watches a job
        several times a second; the services throttle describe calls), at once after it ended (never changes)."""
        now = time.monotonic()
        seen = self._seen.get(name)
        if seen is not None and (seen[1].phase.done or now - seen[0] < self.config.poll_s):
            return seen[1]
        state = await self.service.describe(name)
        if len(self._seen) >= MAX_SEEN:  # a daemon's lifetime of attempts: keep memory bounded
            self._seen.clear()
        self._seen[name] = (now, state)
        return state

    async def offers(self, request: OfferRequest) -> OfferSet:
        found = await asyncio.to_thread(catalog_offers, self.name, request)
        regions = self.regions()
        if regions is None or not found.offers:
            return found
        kept = [o for o in found.offers if o.region in regions]
        if kept:
            return found.model_copy(update={"offers": kept})
        return OfferSet(backend=self.name, reasons=[f"no catalog row fits in region {', '.join(regions)} (where "
                                                    f"this backend creates jobs; set {self.name}.region)"])

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        bundle_key = f"bundles/{ctx.bundle_sha256}.tar"
        await transfer.upload(bundle, stored_size=lambda: self.store.size(bundle_key),
                              put=lambda path, progress: self.store.upload(path, bundle_key, progress),
                              progress=self.progress)
        pack = await asyncio.to_thread(self.runtime_pack)
        pack_key = f"runtime/{pack.sha256}.zip"
        await transfer.upload(pack.path, stored_size=lambda: self.store.size(pack_key),
                              put=lambda path, progress: self.store.upload(path, pack_key, progress),
                              progress=self.progress)
        sync = self.sync_key(ctx.attempt_id)
        if ctx.resume_from:
            await self._carry(ctx.resume_from, sync)
        inputs = f"attempts/{ctx.attempt_id}/{INPUT}/"
        await self._put_inputs(inputs, pack_key, self._launch_plan(spec, ctx, bundle_key))
        name = job_name(ctx.attempt_id)
        await self.service.start(self._service_job(name, spec, offer, ctx, bundle_key, sync, inputs))
        return Handle(backend=self.name, attempt_id=ctx.attempt_id,
                      data={"name": name, "sync": sync, "instances": spec.resources.nodes, "spot": offer.spot,
                            "runtime_bytes": pack.size})

    def runtime_pack(self) -> runtime_pack.RuntimePack:
        """What the container needs of trainmaster (backends/managed/runtime_pack.py), for the image's Python."""
        wheels = Path(self.config.runtime_wheels).expanduser() if self.config.runtime_wheels else None
        return runtime_pack.build(runtime_pack.cache_dir(), self.image_python(), self.config.image_machine, wheels)

    def image_python(self) -> str:
        """The image's Python (major.minor): `image_python`, else the default image's, else this interpreter's."""
        if self.config.image_python:
            return self.config.image_python
        return self.default_python if self.config.image is None else runtime_pack.this_python()

    def _launch_plan(self, spec: JobSpec, ctx: AttemptContext, bundle_key: str) -> plan.LaunchPlan:
        res = spec.resources
        return plan.LaunchPlan(
            service=self.service_name, entrypoint=spec.entrypoint, launcher=spec.launcher, nproc=res.nproc,
            nodes=res.nodes, bundle=self.store.uri(bundle_key) if self.service_name == "vertex" else "",
            bundle_sha256=ctx.bundle_sha256, sync="",
            env={**spec.env, JOB_ID: ctx.job_id, SEED: str(ctx.seed), **spec_checkpoint_environment(spec.checkpoint),
                 BUNDLE_SHA256: ctx.bundle_sha256, "PYTHONUNBUFFERED": "1"},
        )

    async def _put_inputs(self, inputs: str, pack_key: str, launch: plan.LaunchPlan) -> None:
        """The job's input folder: the boot script, the launch plan, the runtime pack (copied on the store's side)
        and the `setup` script when there is one."""
        files = {runtime_pack.BOOT: runtime_pack.boot_script(), runtime_pack.PLAN: launch.model_dump_json().encode()}
        if self.config.setup.strip():
            files[runtime_pack.SETUP] = self.config.setup.encode() + b"\n"
        with tempfile.TemporaryDirectory(prefix="trainmaster-input-") as folder:
            for name, data in files.items():
                path = Path(folder) / name
                await asyncio.to_thread(path.write_bytes, data)
                await self.store.upload(path, inputs + name)
        await self.store.copy(pack_key, inputs + runtime_pack.PACK)

    def _service_job(self, name: str, spec: JobSpec, offer: Offer, ctx: AttemptContext, bundle_key: str,
                     sync: str, inputs: str) -> ServiceJob:
        limit = max_seconds(spec, offer, ctx)
        return ServiceJob(
            name=name, image=self.config.image or self.default_image(offer), instance=offer.instance,
            instance_count=spec.resources.nodes, gpu_type=offer.gpu_type, gpu_count=offer.gpu_count, spot=offer.spot,
            detail=dict(offer.detail), max_seconds=int(limit) if limit else None,
            bundle_uri=self.service_uri(bundle_key), input_uri=self.service_uri(inputs),
            sync_uri=self.service_uri(sync), model_uri=self.service_uri(f"attempts/{ctx.attempt_id}/model/"),
            labels={"trainmaster-job": ctx.job_id, "trainmaster-attempt": ctx.attempt_id},
        )

    def service_uri(self, key: str) -> str:
        """`key` as the training service names it in a job (the store's own URI; Azure ML: a datastore URI)."""
        return self.store.uri(key)

    async def _carry(self, resume_from: str, sync: str) -> None:
        """Copy an earlier attempt's checkpoints and metrics (a synced folder of this store) into `sync`."""
        root = self.store.uri("attempts/")
        if not resume_from.startswith(root):
            raise BackendError(f"cannot resume from {resume_from}: not an attempt of this {self.name} store ({root})")
        source = resume_from[len(self.store.uri()):].rstrip("/") + "/"
        wanted = [source + plan.SYNC_CHECKPOINTS + "/", source + plan.SYNC_OUTPUTS + "/" + METRICS_FILE]
        for prefix in wanted:
            for found in await self.store.list(prefix):
                await self.store.copy(found.key, sync + found.key[len(source):])

    async def _state(self, handle: Handle) -> tuple[ServiceState, dict | None]:
        state = await self.describe(handle.data["name"])
        ended = await self._record(handle, plan.SYNC_EXIT) if state.phase.done else None
        return state, ended

    async def _record(self, handle: Handle, name: str, limit: int = MAX_RECORD_BYTES) -> dict | None:
        """A JSON record of the synced folder, read bounded; None when it is missing or does not parse."""
        data = await self.store.read(handle.data["sync"] + name, 0, limit)
        try:
            found = json.loads(data) if data else None
        except ValueError:
            return None
        return found if isinstance(found, dict) else None

    async def status(self, handle: Handle) -> AttemptStatus:
        state, ended = await self._state(handle)
        recorded = None if ended is None else ended.get("exit_code")  # the container's bytes: 0.0 or false is no exit 0
        code = recorded if type(recorded) is int else None  # an exit code only as a JSON integer
        finished = code == 0
        if state.phase is Phase.failed and state.cause is None and (ended is None or finished):
            # the service says failed, and the launcher wrote no exit record, or one of an entrypoint that exited 0
            # (a spot VM reclaimed while the service was still finalizing): stopped from outside, not the job's doing
            cause, why = ((Cause.preempted, "preempted: its spot capacity was reclaimed") if handle.data.get("spot")
                          else (Cause.lost, "lost: the container was stopped"))
            found = "its entrypoint exited 0 (the exit record)" if finished else "no exit record in the synced folder"
            state = state.model_copy(update={"cause": cause, "reason": f"{state.reason or 'failed'}: {found} ({why})"})
        status = AttemptStatus(phase=state.phase, cause=state.cause, reason=state.reason, exit_code=state.exit_code,
                               started_at=state.started_at, ended_at=state.ended_at)
        if ended and state.phase in (Phase.failed, Phase.succeeded):
            if code is not None:
                status = status.model_copy(update={"exit_code": code})
                if (state.phase is Phase.failed and state.cause in (None, Cause.script_failed) and code != 0
                        and isinstance(ended.get("reason"), str)):  # a preemption keeps the service's word
                    status = status.model_copy(update={"reason": ended["reason"][:2000]})
        return status

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        """The log from `offset`: node 0's launcher keeps it as closed parts named by the offset each starts at
        (jobs/launcher_publish.py: an object-store mount uploads a file only when it is closed)."""
        done = (await self.describe(handle.data["name"])).phase.done  # before the log: nothing after it is missed
        base = handle.data["sync"] + LOG_PARTS
        parts = sorted((int(name), obj.size) for obj in await self.store.list(base)
                       if (name := obj.key[len(base):].removesuffix(".log")).isascii() and name.isdigit()
                       and obj.key.endswith(".log"))
        data, more = b"", False
        for number, (start, size) in enumerate(parts):
            if start <= offset < start + size:
                data = await self.store.read(f"{base}{start:016d}.log", offset - start, LOG_CHUNK) or b""
                more = offset + len(data) < start + size or number + 1 < len(parts)
                break
            if start > offset:  # a gap (a part still being uploaded): what follows comes once it is there
                more = True
                break
        return LogChunk(text=data.decode(errors="replace"), offset=offset, next_offset=offset + len(data),
                        complete=done and not more)

    async def metrics(self, handle: Handle, offset: int = 0, limit: int = 2**16) -> MetricsChunk:
        key = handle.data["sync"] + plan.SYNC_OUTPUTS + "/" + METRICS_FILE
        size = await self.store.size(key)
        if size is None:
            return MetricsChunk(data=b"", offset=offset, size=0)
        data = await self.store.read(key, offset, limit) or b""
        return MetricsChunk(data=data, offset=offset, size=size, modified_at=time.time())

    async def cancel(self, handle: Handle) -> int | None:
        await self.service.stop(handle.data["name"])
        return None

    async def last_checkpoint(self, handle: Handle) -> CheckpointRef | None:
        """The attempt's synced folder, once its checkpoints hold a segment whose manifest reads."""
        base = handle.data["sync"] + plan.SYNC_CHECKPOINTS + "/segments/"
        names = {obj.key[len(base):].split("/", 1)[0] for obj in await self.store.list(base)
                 if obj.key[len(base):].endswith("/manifest.json")}
        for index in sorted((int(n) for n in names if n.isascii() and n.isdigit()), reverse=True):
            data = await self.store.read(f"{base}{index:08d}/manifest.json", 0, MAX_RECORD_BYTES)
            try:
                step = json.loads(data or b"")["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return CheckpointRef(uri=self.store.uri(handle.data["sync"]), segment=index, step=step)
        return None

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        """The outputs the launcher listed in its manifest (sizes and sha256 it took on the machine), each
        checked as it arrives, into `dest` atomically; a file the listing and the manifest disagree on is refused."""
        if dest.exists():
            return transfer.list_files(dest)
        base = handle.data["sync"] + plan.SYNC_OUTPUTS + "/"
        manifest = await self._manifest(handle)
        stored = {obj.key[len(base):]: obj.size for obj in await self.store.list(base)}
        if set(stored) != set(manifest) or any(stored[p] != manifest[p][0] for p in stored):
            extra, missing = sorted(set(stored) - set(manifest)), sorted(set(manifest) - set(stored))
            raise BackendError(f"the outputs in {self.store.uri(base)} differ from the launcher's manifest "
                               f"(not listed: {extra[:5]}, missing: {missing[:5]})")
        tmp = dest.with_name(f".{dest.name}{transfer.PARTIAL}")
        total, done, files = sum(size for size, _ in manifest.values()), 0, []
        for path, (size, sha256) in sorted(manifest.items()):
            target = tmp / path
            if not target.resolve().is_relative_to(tmp.resolve()):
                raise ExecutorFault(f"output path {path!r} leaves the outputs folder")

            def step(have: int, _all: int | None, before=done) -> None:
                if progress:
                    progress(before + have, total)

            files.append((await transfer.download(lambda offset, key=base + path: self.store.stream(key, offset),
                                                  target, size=size, sha256=sha256, progress=step))
                         .model_copy(update={"path": path}))
            done += size
        if not files:
            await asyncio.to_thread(tmp.mkdir, parents=True, exist_ok=True)
        await asyncio.to_thread(os.replace, tmp, dest)
        return files

    async def _manifest(self, handle: Handle) -> dict[str, tuple[int, str]]:
        found = await self._record(handle, plan.SYNC_MANIFEST, MAX_MANIFEST_BYTES)
        if found is None:
            raise BackendError(f"no output manifest in {self.store.uri(handle.data['sync'])}: the launcher did not "
                               "finish (see the attempt's log)")
        try:
            return {str(p): (int(v["size"]), str(v["sha256"])) for p, v in found["files"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BackendError(f"the output manifest does not read: {exc}") from None

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        state = await self.service.describe(handle.data["name"])  # fresh: billable time can come after the end
        instances = int(handle.data.get("instances", 1))
        if state.billable_seconds is not None:
            seconds, source = state.billable_seconds, state.billing_basis or "billable seconds as the service reports them"
        elif state.started_at is not None:
            seconds, source = max(0.0, (state.ended_at or time.time()) - state.started_at), "run time"
        else:
            return Cost(micro_usd=0, billable_seconds=0, basis="never started")
        price = offer.price_per_hour_micro_usd
        if offer.spot and state.billed_at_on_demand and "on_demand_micro_usd_per_hour" in offer.detail:
            price, source = int(offer.detail["on_demand_micro_usd_per_hour"]), source + ", spot saving included, at the on-demand price"
        compute = -(-int(seconds * 1000) * instances * price // 3_600_000)
        stored = sum(obj.size for obj in await self.store.list(handle.data["sync"]))
        outputs = sum(obj.size for obj in await self.store.list(handle.data["sync"] + plan.SYNC_OUTPUTS + "/"))
        egress = -(-outputs * EGRESS_MICRO_USD_PER_GB[self.name] // 10**9)
        storage = -(-stored * STORAGE_MICRO_USD_PER_GB_MONTH // 10**9)  # a month of keeping what it wrote
        basis = (f"compute {seconds:.0f} s × {instances} instance(s) × {price} µUSD/h "
                 f"({source}; price recorded at dispatch) = {compute} µUSD; egress (estimated) {outputs} B of outputs "
                 f"= {egress} µUSD; storage (estimated) {stored} B for a month = {storage} µUSD")
        return Cost(micro_usd=compute + egress + storage, billable_seconds=seconds * instances, basis=basis)

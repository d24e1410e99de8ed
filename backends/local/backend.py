"""The local backend: runs a bundle on this machine under torchrun (gloo on CPU, NCCL on GPUs).

Each attempt gets a fresh work dir (the bundle extracted into `code/`, plus `outputs/`,
`checkpoints/` and `job.log`) and a detached supervisor process (`supervisor.py`) that owns
the job's process group, started by a keeper (`keeper.py`) that stops whatever the job started
once the supervisor is gone, however it went. Everything a later process needs to find the
attempt again is in the work dir, so the handle is just its path, and a second `submit` of the
same attempt finds the first run instead of starting another; a launch whose process died half-way (a CLI
killed before it started the keeper) is finished by the next one, never blamed on the job (launching.py). Cost is wall time × the power model.
The broker reads none of the work dir itself: it asks `last_checkpoint` (the checkpoint folder, once
it holds a segment) and `metrics` (bytes of `outputs/metrics.jsonl` from an offset), and under its
retention policy it asks `segments_held` and `release_segments` (the segments of `checkpoints/segments/`
it no longer needs, by index) rather than walking or deleting anything here. What a runtime's segments look
like on a filesystem is backends/segments.py's, shared with the Ray backend and the reference miner; the time
limit its supervisor enforces is backends/time_limit.py's, shared with the managed backends.

The machine is a resource (allocation.py): each attempt holds the GPUs it was given exclusively (it sees
only those, through CUDA_VISIBLE_DEVICES), and its CPUs and memory by request; the broker queues a job
that does not fit now. The inventory is the one detected, or the one `backends.yaml` sets (`local:
cpus/memory_gb/gpus`). A job with `limits.max_usd` gets a time limit its remaining money buys at the
offer's price, so its supervisor stops it at the cap even when no broker process is watching.

No orphans: a supervisor found dead without having recorded the end has the rest of its attempt
stopped (processes.py) and the end recorded here, once, in `exit.json`: when the last process
was stopped, or the supervisor's last heartbeat when nothing was left, so every later status()
and cost() agree. `cancel` stops whatever of an attempt still runs, whatever its recorded state.
An attempt has ended once its supervisor has, not when its job's process did: the supervisor records the job's
end, then stops what the job left running and takes a confined job's folders back, and until it exits status()
says running, so nothing fetches outputs a leftover process may still change.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainmaster.backends import transfer
from trainmaster.backends.base import (
    AttemptContext, AttemptStatus, Backend, BackendError, Cause, Cost, Handle, LocalEnvironmentError, LogChunk, Offer,
    OfferRequest, OfferSet, OutputFile, Phase, Progress,
)
from trainmaster.backends.features import (
    AllocatesMachine, CheckpointRef, HeldSegment, KeepsSegments, MetricsChunk, NotesInRunLog, ReleasesSegments,
    ReportsMetrics,
    ResumesFromCheckpoints, SupportsMultiGpu,
)
from trainmaster.backends.hardware import Gpu, Machine, this_host, this_machine
from trainmaster.backends.local import allocation, ddp_reason, launching, oom, processes, sandbox
from trainmaster.backends.local import supervisor as sup
from trainmaster.backends.local.config import LocalConfig
from trainmaster.backends.segments import copy_segments, held_segments, newest_segment, release_segments
from trainmaster.backends.time_limit import max_seconds, time_limit
from trainmaster.jobs import bundle as bundles
from trainmaster.jobs.environment import OUTPUT_DIR, job_environment
from trainmaster.jobs.inherited import inherited
from trainmaster.jobs.files import (
    HostileFile, open_regular, read_regular, write_json_atomic,
)
from trainmaster.jobs.launch_command import DIRECT, resolve_launcher, single_process_env
from trainmaster.jobs.metrics import FILENAME as METRICS_FILE
from trainmaster.jobs.spec import PYTHON_NAMES, JobSpec

CANCEL_GRACE_S = 10.0
SUPERVISOR_START_S = 30.0
LOG_CHUNK = 2**20
MAX_RECORD_BYTES = 2**20
"""The supervisor's records (launch, start, exit) are a few hundred bytes; the job runs beside them
and could replace one with a 4 GB file or a FIFO, so each is read bounded and never followed."""


class LocalBackend(SupportsMultiGpu, KeepsSegments, ReleasesSegments, ResumesFromCheckpoints, ReportsMetrics,
                   AllocatesMachine, NotesInRunLog, Backend):
    name = "local"
    unsupported = {
        "multi_node": "runs on this machine only",
        "spot": "your own GPUs are never preempted, so there is no spot price",
        "remote_data": "reads local paths only; copy s3://, gs:// or az:// data down first",
    }

    config_model = LocalConfig
    exact_replay = True
    config: LocalConfig

    def __init__(self, config: LocalConfig | None = None, machine: Machine | None = None):
        super().__init__(config)
        self._machine = machine

    @property
    def power(self):
        return self.config.power

    @property
    def machine(self) -> Machine:
        return self._machine or inventory(self.config)

    async def offers(self, request: OfferRequest) -> OfferSet:
        spec = request.spec
        reasons = self.infeasible(spec)
        if reasons:
            return OfferSet(backend=self.name, reasons=reasons)
        m, res = self.machine, spec.resources
        gpus = self._pick_gpus(spec)
        offer = Offer(
            backend=self.name,
            instance=socket.gethostname(),
            region="local",
            gpu_type=gpus[0].name if gpus else None,
            gpu_count=len(gpus),
            gpu_memory_mb=gpus[0].memory_mb if gpus else None,
            cpus=m.cpus,
            memory_mb=m.memory_mb,
            price_per_hour_micro_usd=self.power.price_per_hour_micro(len(gpus)),
            detail={"gpu_indices": [g.index for g in gpus], "nproc": res.nproc},
            quote={"source": "power model"},
        )
        return OfferSet(backend=self.name, offers=[offer])

    def infeasible(self, spec: JobSpec) -> list[str]:
        """Why this machine cannot run `spec` (empty when it can); features it lacks are the broker's check."""
        m, res = self.machine, spec.resources
        reasons = []
        if res.gpus > len(m.gpus):
            have = f"{len(m.gpus)} ({', '.join(g.name for g in m.gpus)})" if m.gpus else "none"
            reasons.append(f"needs {res.gpus} GPU(s); this machine has {have}")
        elif res.gpus and len(self._pick_gpus(spec)) < res.gpus:
            reasons.append(
                f"needs {res.gpus} GPU(s) of type {'/'.join(res.gpu_types) or 'any'}"
                + (f" with ≥ {res.min_vram_gb} GB" if res.min_vram_gb else "")
                + f"; this machine has {', '.join(f'{g.name} ({g.memory_mb // 1024} GB)' for g in m.gpus)}"
            )
        if not res.gpus and res.nproc > m.cpus:
            reasons.append(f"needs {res.nproc} CPU processes; this machine has {m.cpus} CPUs")
        if res.cpus > m.cpus:
            reasons.append(f"needs {res.cpus} CPUs; this machine has {m.cpus}")
        if res.memory_gb and res.memory_gb * 1024 > m.memory_mb:
            reasons.append(f"needs {res.memory_gb} GB of memory; this machine has {m.memory_mb // 1024} GB")
        return reasons

    def _pick_gpus(self, spec: JobSpec):
        return allocation.eligible_gpus(self.machine, spec)[: spec.resources.gpus]

    def fit(self, spec: JobSpec, held: list[dict]) -> tuple[dict | None, str]:
        got = allocation.fit(self.machine, spec, [allocation.Claim.of(c) for c in held])
        return (got.claim.to_dict() if got.claim else None), got.why

    def claimed(self, offer: Offer, claim: dict) -> Offer:
        return offer.model_copy(update={"detail": {**offer.detail, "gpu_indices": list(claim["gpus"])}})

    # running

    async def submit(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext) -> Handle:
        if self.config.sandbox and (reason := sandbox.cannot_confine()):
            raise LocalEnvironmentError(reason)
        workdir = Path(ctx.workdir)
        workdir.mkdir(parents=True, exist_ok=True)

        def start_keeper() -> None:
            with open(workdir / "supervisor.err", "ab") as err:
                keeper_process = subprocess.Popen(  # the keeper starts the supervisor below itself (keeper.py)
                    [sys.executable, "-m", "trainmaster.backends.local.keeper", str(workdir)],
                    cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    start_new_session=True, close_fds=True,
                    env=inherited(os.environ, self.config.inherit_env),  # never the broker's secrets (jobs/inherited.py)
                )
            reap(keeper_process)

        try:  # once, also when an earlier launch of this attempt died half-way (launching.py)
            await launching.launch_once(workdir, lambda: self._prepare(bundle, spec, offer, ctx, workdir), start_keeper,
                                        timeout=SUPERVISOR_START_S)
        except TimeoutError as exc:
            raise BackendError(f"the local supervisor did not start: {exc}") from None
        await self._wait_for_supervisor(workdir)
        return self.handle(ctx)

    def _prepare(self, bundle: Path, spec: JobSpec, offer: Offer, ctx: AttemptContext, workdir: Path) -> None:
        code = workdir / "code"
        if not code.exists():
            bundles.extract_bundle(bundle, code, expected_sha256=ctx.bundle_sha256)
        for sub in ("outputs", "checkpoints"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        if ctx.resume_from:
            _carry_metrics(Path(ctx.resume_from), workdir / "outputs")
        write_json_atomic(workdir / sup.LAUNCH, self._launch(spec, offer, ctx, workdir))

    def handle(self, ctx: AttemptContext) -> Handle:
        return Handle(backend=self.name, attempt_id=ctx.attempt_id, data={"workdir": ctx.workdir})

    def _launch(self, spec: JobSpec, offer: Offer, ctx: AttemptContext, workdir: Path) -> dict:
        """What the supervisor runs. `env` holds only the variables trainmaster sets and the spec's
        `env`: the inherited environment is merged by the supervisor at run time, never written here."""
        nproc = int(offer.detail.get("nproc", 1))
        env = {**spec.env, **job_environment(
            job_id=ctx.job_id, output_dir=workdir / "outputs", checkpoint_dir=workdir / "checkpoints",
            seed=ctx.seed, segment_steps=spec.checkpoint.segment_steps, bundle_sha256=ctx.bundle_sha256,
            resume_from=Path(ctx.resume_from) if ctx.resume_from else None,
            keep_every=spec.checkpoint.keep_every, max_disk_gb=spec.checkpoint.max_disk_gb,
            selfcheck=spec.checkpoint.selfcheck,
        ), "PYTHONUNBUFFERED": "1"}
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in offer.detail.get("gpu_indices", []))
        launcher = resolve_launcher(spec.launcher, nproc)
        if launcher == DIRECT:
            env.update(single_process_env())
        return {
            "entrypoint": spec.entrypoint,
            "launcher": launcher,
            "nproc": nproc,
            "python": sys.executable,
            "python_names": sorted(PYTHON_NAMES),
            "cwd": str(workdir / "code"),
            "env": env,
            "max_seconds": max_seconds(spec, offer, ctx), "time_limit": time_limit(spec, offer, ctx),
            "requirements": str(workdir / "code" / spec.environment.requirements)
            if spec.environment.python == "requirements" else None,
            "envs_dir": self.config.envs_dir or str(workdir.parent / "envs"),
            "sandbox": self.config.sandbox.model_dump() if self.config.sandbox else None,
            "inherit": list(self.config.inherit_env),
        }

    @staticmethod
    async def _wait_for_supervisor(workdir: Path, timeout: float = SUPERVISOR_START_S) -> None:
        deadline = time.time() + timeout
        while not (workdir / sup.SUPERVISOR).exists():
            if time.time() > deadline:
                err = (workdir / "supervisor.err").read_text(errors="replace")[-2000:] if (workdir / "supervisor.err").exists() else ""
                raise BackendError(f"the local supervisor did not start within {timeout:.0f} s: {err}")
            await asyncio.sleep(0.005)

    async def status(self, handle: Handle) -> AttemptStatus:
        return await asyncio.to_thread(_status, Path(handle.data["workdir"]))

    async def logs(self, handle: Handle, offset: int = 0) -> LogChunk:
        workdir = Path(handle.data["workdir"])
        done = (await asyncio.to_thread(_status, workdir)).phase.done  # before the log, so nothing written after it is missed
        try:
            with _open_log(workdir) as f:
                f.seek(offset)
                data = f.read(LOG_CHUNK)
                more = bool(f.read(1))
        except (FileNotFoundError, HostileFile):  # a log the job replaced by a FIFO or link is not read
            data, more = b"", False
        text = data.decode(errors="replace")
        return LogChunk(text=text, offset=offset, next_offset=offset + len(data), complete=done and not more)

    async def note(self, handle: Handle, line: str) -> None:
        await asyncio.to_thread(_append_note, Path(handle.data["workdir"]) / sup.LOG, f"[trainmaster] {line}\n")

    async def cancel(self, handle: Handle) -> int:
        """Stop the attempt: SIGTERM to its process group while the supervisor lives (it records the
        cancel; torchrun stops its workers), up to CANCEL_GRACE_S, then SIGKILL to whatever of the
        attempt is left, whatever its recorded state. Returns how many processes had to be killed."""
        workdir = Path(handle.data["workdir"])
        started = _read_json(workdir / sup.SUPERVISOR)
        if started is None:
            return 0
        if processes.is_running(started):
            _signal_group(started["pid"], signal.SIGTERM)  # the supervisor leads its own session and process group
            deadline = time.time() + CANCEL_GRACE_S
            while time.time() < deadline and processes.is_running(started):
                await asyncio.sleep(0.1)
        return await asyncio.to_thread(_reap, workdir, started, cancelled=True)

    async def open_segments(self, handle: Handle, indices: list[int], dest: Path) -> Path:
        """Every segment's manifest and the whole of each challenged segment and the one after it, laid out
        in `dest` (the broker's) as the runtime's checkpoint directory: hard-linked where one filesystem holds
        both (the run has ended, nothing writes to them), hashed as they go, so the broker reads nothing of
        this backend's own folder."""
        return await copy_segments(Path(handle.data["workdir"]) / "checkpoints", indices, Path(dest))

    async def last_checkpoint(self, handle: Handle) -> CheckpointRef | None:
        """The attempt's checkpoint directory, once it holds anything (the runtime resumes from its newest
        complete segment)."""
        checkpoints = Path(handle.data["workdir"]) / "checkpoints"
        held = await asyncio.to_thread(lambda: checkpoints.is_dir() and any(checkpoints.iterdir()))
        if not held:
            return None
        newest = await asyncio.to_thread(newest_segment, checkpoints)
        return CheckpointRef(uri=str(checkpoints), segment=newest[0] if newest else None,
                             step=newest[1] if newest else None)

    async def segments_held(self, handle: Handle) -> list[HeldSegment]:
        """Each entry of `checkpoints/segments/`: a complete segment by its index, a half-written one (a name
        that is not a number: a kill left it) with index None."""
        return await asyncio.to_thread(held_segments, Path(handle.data["workdir"]))

    async def release_segments(self, handle: Handle, keep: set[int]) -> int:
        """Remove every entry of `checkpoints/segments/` but the segments in `keep`; the bytes freed."""
        return await asyncio.to_thread(release_segments, Path(handle.data["workdir"]), set(keep))

    async def metrics(self, handle: Handle, offset: int = 0, limit: int = 2**16) -> MetricsChunk:
        path = Path(handle.data["workdir"]) / "outputs" / METRICS_FILE
        return await asyncio.to_thread(MetricsChunk.from_file, path, offset, limit)

    async def fetch(self, handle: Handle, dest: Path, progress: Progress | None = None) -> list[OutputFile]:
        """Copy the outputs to `dest` atomically, each file hashed as it is copied; idempotent."""
        return await transfer.copy_tree(Path(handle.data["workdir"]) / "outputs", dest, progress)

    async def cost(self, handle: Handle, offer: Offer) -> Cost:
        st = await asyncio.to_thread(_status, Path(handle.data["workdir"]))
        if st.started_at is None:
            return Cost(micro_usd=0, billable_seconds=0, basis="never started")
        seconds = max(0.0, (st.ended_at or time.time()) - st.started_at)
        micro = -(-int(seconds * 1000) * offer.price_per_hour_micro_usd // 3_600_000)  # rounded up to the micro-dollar
        return Cost(micro_usd=micro, billable_seconds=seconds,
                    basis=f"{seconds:.1f} s × {offer.price_per_hour_micro_usd} µUSD/h (power model)")


def inventory(config: LocalConfig) -> Machine:
    """What the backend allocates: the detected machine, with what backends.yaml sets laid over it
    (a GPU list set there is used as it is, and NVML and torch are not asked)."""
    if config.cpus is None and config.memory_gb is None and config.gpus is None:
        return this_machine()
    found = this_host() if config.gpus is not None else this_machine()
    gpus = found.gpus if config.gpus is None else tuple(
        Gpu(index=i, name=g.name, memory_mb=g.memory_gb * 1024) for i, g in enumerate(config.gpus))
    return Machine(cpus=config.cpus or found.cpus,
                   memory_mb=config.memory_gb * 1024 if config.memory_gb else found.memory_mb, gpus=gpus)


def _carry_metrics(resume_from: Path, outputs: Path) -> None:
    """A resumed attempt starts with the `metrics.jsonl` of the attempt it resumes from (a work dir of this
    backend: `checkpoints/` beside `outputs/`); the runtime cuts it back to the resume step, so the job's
    record holds every line, as an uninterrupted run's would (docs/runtime.md, Resume)."""
    earlier, target = resume_from.parent / "outputs" / METRICS_FILE, outputs / METRICS_FILE
    if earlier.is_file() and not target.exists():
        shutil.copyfile(earlier, target)


def _status(workdir: Path) -> AttemptStatus:
    ended = _read_json(workdir / sup.EXIT)
    started = _read_json(workdir / sup.SUPERVISOR)
    if ended is not None and started is not None and processes.is_running(started):
        # the job has ended, its supervisor not yet: it is stopping what the job left running and taking a confined
        # job's folders back (supervisor.py), so its outputs are not final and nobody may fetch them yet
        return AttemptStatus(phase=Phase.running, started_at=started["started_at"])
    if ended is not None:
        if ended["cancelled"]:
            phase = Phase.cancelled
        else:
            phase = Phase.succeeded if ended["exit_code"] == 0 else Phase.failed
        reason = ended["reason"] or (None if phase is Phase.succeeded else
                                     _exit_reason(workdir, ended["exit_code"], ended.get("oom_killed", False)))
        return AttemptStatus(phase=phase, cause=_cause(ended, phase), reason=reason, exit_code=ended["exit_code"],
                             started_at=ended["started_at"], ended_at=ended["ended_at"])
    if started is None:
        return AttemptStatus(phase=Phase.pending)
    if processes.is_running(started):
        return AttemptStatus(phase=Phase.running, started_at=started["started_at"])
    if not (workdir / sup.EXIT).exists():  # else it finished between the two reads
        _reap(workdir, started, cancelled=False)
    return _status(workdir)


def _reap(workdir: Path, started: dict, *, cancelled: bool) -> int:
    """Kill what is left of an attempt (its supervisor dead, or not stopping when cancelled) and, when
    the supervisor recorded no end, record one: when the last process was stopped, or the last
    heartbeat when nothing was left. Returns how many processes were killed."""
    alive = processes.is_running(started)
    beat = max(started["started_at"], _mtime(workdir / sup.HEARTBEAT, default=0.0))
    marker = (_read_json(workdir / sup.LAUNCH) or {}).get("env", {}).get(OUTPUT_DIR, str(workdir / "outputs"))
    beat_since_boot = processes.heartbeat_since_boot(workdir / sup.HEARTBEAT)  # None: an older supervisor's beat
    left = processes.attempt_processes(
        started, marker=marker, until=None if alive else beat + 2 * sup.HEARTBEAT_S,
        until_since_boot=None if alive or beat_since_boot is None else beat_since_boot + 2 * sup.HEARTBEAT_S)
    ended = processes.stop(left, grace=0) if left else beat
    if not (workdir / sup.EXIT).exists():
        reason = "the process died without finishing (killed or crashed)"
        if left:
            reason += f"; {len(left)} process(es) it left were stopped"
        _write_json_once(workdir / sup.EXIT, {"exit_code": None, "reason": "cancelled" if cancelled else reason,
                                              "cancelled": cancelled, "started_at": started["started_at"],
                                              "ended_at": ended, "recorded_by": "backend"})
    return len(left)


def _write_json_once(path: Path, obj: dict) -> None:
    """Create `path` with `obj` unless it exists: the first of concurrent writers wins, atomically."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _cause(ended: dict, phase: Phase) -> Cause | None:
    """Why the attempt ended: cancelled on request; lost when its supervisor vanished without recording
    an exit code (killed, or the machine restarted); otherwise the job's own exit (its memory, its time
    limit included): the script failed."""
    if phase is Phase.succeeded:
        return None
    if ended["cancelled"]:
        return Cause.cancelled
    return Cause.lost if ended["exit_code"] is None else Cause.script_failed


def _exit_reason(workdir: Path, code: int, oom_killed: bool | None = False) -> str:
    """`exited with code N` (or who killed it), and the last line the job printed (an error's message,
    e.g. a traceback's last line; never a line the supervisor wrote, such as its stopping of leftovers)."""
    try:
        with _open_log(workdir) as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - ddp_reason.TAIL_BYTES))
            tail = f.read().decode(errors="replace")
    except (OSError, HostileFile):
        tail = ""
    lines = [line.strip() for line in tail.splitlines()
             if line.strip() and not line.startswith(sup.LEFTOVERS)]  # the job's last line, not ours
    ranked = ddp_reason.failed_rank(workdir, tail)  # under torchrun: the failing rank's own last error line
    if ranked:
        return f"{ranked} (torchrun {_how_it_exited(code, oom_killed)})"
    last = ddp_reason.last_meaningful(lines)  # never a banner of rule characters
    return _how_it_exited(code, oom_killed) + (f": {last[-500:]}" if last else "")


def _how_it_exited(code: int, oom_killed: bool | None) -> str:
    """`oom_killed`: whether the kernel's OOM killer struck while it ran (None: cannot tell)."""
    if code not in oom.KILLED:
        return f"exited with code {code}"
    if oom_killed:
        return (f"killed by the kernel's out-of-memory killer (SIGKILL, exit code {code}): the job needed more "
                "memory than the machine had free")
    if oom_killed is None:
        return (f"killed by SIGKILL (exit code {code}): by the kernel's out-of-memory killer or by hand "
                "(the kernel log, dmesg, says which)")
    return f"killed by SIGKILL (exit code {code}), not by the out-of-memory killer"


def _open_log(workdir: Path):
    """The attempt's log, opened when it is a regular file (:class:`HostileFile` otherwise, never opened)."""
    fd, _ = open_regular(workdir / sup.LOG)
    return os.fdopen(fd, "rb")


def _append_note(path: Path, text: str) -> None:
    """`text` appended to the log the supervisor writes (both append: lines do not interleave); a log the job
    replaced by a link or a special file is left alone, as is one that is gone."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.write(fd, text.encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def _read_json(path: Path) -> dict | None:
    """A supervisor record; None when it is missing or is not a regular file of at most MAX_RECORD_BYTES."""
    try:
        return json.loads(read_regular(path, MAX_RECORD_BYTES))
    except (FileNotFoundError, HostileFile):
        return None


def _mtime(path: Path, default: float) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return default


def reap(child: subprocess.Popen) -> None:
    """Wait for the keeper in a thread of its own, so a long-lived parent (the daemon) never keeps it as a zombie."""
    import threading

    threading.Thread(target=child.wait, name=f"reap-{child.pid}", daemon=True).start()

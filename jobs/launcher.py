"""The container launcher: `python -m trainmaster.jobs.launcher`, what a managed backend's container (through its
boot script, jobs/launcher_boot.py) or a Ray job starts.

It reads the plan from the file TRAINMASTER_LAUNCH_FILE names (the managed services: `launch.json` of the job's
input), else from `TRAINMASTER_LAUNCH` (Ray) (jobs/launch_plan.py; a bad plan exits 2, the reason on stderr),
finds the bundle and the synced folder where the service put them (jobs/services.py), checks the bundle's
sha256 and unpacks it into a fresh local folder (a mismatch exits 2 before anything runs), and runs the
entrypoint as the local backend would (jobs/launch_command.py): one process, or torchrun across the service's
machines, or (where the service started a launcher per process: Ray Train) the one process with the rank
variables the service set, rank 0's launcher then standing for node 0's below. On the managed services the
synced folder is an object-store mount: node 0's job writes its outputs and checkpoints locally and the launcher
publishes them there as closed files, the log as parts (jobs/launcher_publish.py); on Ray (a shared filesystem)
the job writes into it directly and the log is `job.log`, appended as it comes. The other nodes get local scratch
folders. Node 0 also tees what the job prints to its own stdout, and once the job ended writes the outputs'
manifest and the exit record (jobs/synced_folder.py) and copies the outputs into the service's model folder.
SIGTERM or SIGINT to the launcher goes to the job's process group; the launcher exits with the job's exit code;
killed outright, it takes the job's first process with it (Linux). Formats: docs/runtime.md, "The container
launcher".

It imports only the standard library, pydantic and small `jobs` modules: no torch, so it starts at once.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import ValidationError

from trainmaster.jobs import launch_command, launcher_publish, synced_folder
from trainmaster.jobs.bundle import BundleError, extract_bundle
from trainmaster.jobs.environment import CHECKPOINT_DIR, OUTPUT_DIR, RESUME_FROM, interpreter_environment
from trainmaster.jobs.launch_plan import FILE_VARIABLE, SYNC_CHECKPOINTS, SYNC_LOG, SYNC_OUTPUTS, VARIABLE, LaunchPlan
from trainmaster.jobs.services import Placement, PlacementError, place
from trainmaster.jobs.spec import PYTHON_NAMES

REFUSED = 2
"""The exit code of a launch that never started the job: a bad plan, a bundle that does not match."""
READ_CHUNK = 2**16
TAIL_BYTES = 4096
PREFIX = "[trainmaster]"
PR_SET_PDEATHSIG = 1
PUBLISHED = ("sagemaker", "vertex", "azureml")
"""Services whose synced folder is an object-store mount: node 0's job writes locally, the launcher publishes."""


class Refused(Exception):
    """The job cannot start; the message says why (the launcher exits REFUSED)."""


def main() -> int:
    started = time.time()
    try:
        plan = read_plan(*plan_text(os.environ))
        where = place(plan, os.environ)
        launcher = (launch_command.DIRECT if where.ranks  # the service started this one process of many
                    else launch_command.resolve_launcher(plan.launcher, plan.nproc, where.nnodes))
        if launcher == launch_command.DIRECT and where.nnodes > 1 and not where.ranks:
            raise Refused(f"the launcher 'direct' runs one process; this job has {where.nnodes} nodes")
    except (Refused, PlacementError) as exc:
        print(f"{PREFIX} cannot launch: {exc}", file=sys.stderr, flush=True)
        return REFUSED
    scratch = Path(tempfile.mkdtemp(prefix="trainmaster-"))
    try:
        return run(plan, where, launcher, scratch, started)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def plan_text(environ) -> tuple[str | None, str]:
    """The launch plan's JSON and where it came from: the file TRAINMASTER_LAUNCH_FILE names (the managed
    services: a file of the job's input, jobs/launcher_boot.py), else the TRAINMASTER_LAUNCH variable (Ray)."""
    path = environ.get(FILE_VARIABLE)
    if path:
        try:
            return Path(path).read_text(encoding="utf-8"), path
        except (OSError, UnicodeDecodeError) as exc:
            raise Refused(f"the launch plan {path} cannot be read: {exc}") from exc
    return environ.get(VARIABLE), VARIABLE


def read_plan(text: str | None, source: str = VARIABLE) -> LaunchPlan:
    if not text:
        raise Refused(f"neither {FILE_VARIABLE} nor {VARIABLE} is set: one names or holds the launch plan")
    try:
        return LaunchPlan.model_validate_json(text)
    except ValidationError as exc:
        raise Refused(f"{source} is not a launch plan: {exc}") from exc


def run(plan: LaunchPlan, where: Placement, launcher: str, scratch: Path, started: float) -> int:
    """Unpack, run and record the job on this node; its exit code."""
    lead = where.lead
    published = lead and plan.service in PUBLISHED
    folders = (scratch / "work" if published else where.sync) if lead else scratch
    if published:  # the job writes locally; the launcher publishes closed files (jobs/launcher_publish.py)
        launcher_publish.restore(where.sync, folders, (SYNC_OUTPUTS, SYNC_CHECKPOINTS))
    for sub in (SYNC_OUTPUTS, SYNC_CHECKPOINTS):
        (folders / sub).mkdir(parents=True, exist_ok=True)
    publisher = (launcher_publish.Publisher(folders, where.sync, (SYNC_OUTPUTS, SYNC_CHECKPOINTS)).start()
                 if published else None)
    log = where.sync / SYNC_LOG if lead and not published else None
    with Tee(log, publisher.log if publisher else None) as tee:
        process = f", process {where.ranks['RANK']} of {where.ranks['WORLD_SIZE']}" if where.ranks else ""
        tee.say(f"node {where.node_rank} of {where.nnodes}{process}; bundle {where.bundle}; synced folder {where.sync}")
        try:
            extract_bundle(where.bundle, scratch / "code", expected_sha256=plan.bundle_sha256)
        except BundleError as exc:
            code, reason = REFUSED, f"the bundle is refused: {exc}"
            tee.say(reason)
        else:
            resume = folders / SYNC_CHECKPOINTS if published else where.sync / SYNC_CHECKPOINTS
            env = job_env(plan, where, folders, launcher, resume)
            argv, shown = command(plan, where, launcher, env)
            tee.say(f"$ {shown}")
            code, how = supervise(argv, env, scratch / "code", tee)
            reason = how + (f": {tee.last_line()}" if tee.last_line() else "")
        if publisher is not None:
            publisher.finish()
        if lead:
            manifest = synced_folder.record_end(where.sync, folders / SYNC_OUTPUTS, exit_code=code, reason=reason,
                                                started_at=started, ended_at=time.time())
            if where.model_dir is not None:
                synced_folder.copy_outputs(folders / SYNC_OUTPUTS, manifest, where.model_dir)
    return code


def job_env(plan: LaunchPlan, where: Placement, folders: Path, launcher: str, resume: Path | None = None) -> dict[str, str]:
    """The job's environment: this container's, the plan's `env`, the folders, and one process's rank variables
    when it runs directly (the service's when it started one launcher per process). Every node resumes from the
    checkpoints `resume` names (node 0's own copy of the synced ones on an object-store mount, else the synced
    folder's) when they hold a segment (the others' own checkpoints are scratch: only rank 0 writes)."""
    synced = resume if resume is not None else where.sync / SYNC_CHECKPOINTS
    env = {k: v for k, v in os.environ.items() if k not in (VARIABLE, FILE_VARIABLE)}
    env.update(plan.env)
    env.update({OUTPUT_DIR: str(folders / SYNC_OUTPUTS), CHECKPOINT_DIR: str(folders / SYNC_CHECKPOINTS),
                RESUME_FROM: str(synced) if synced_folder.holds_segment(synced) else "", "PYTHONUNBUFFERED": "1"})
    if launcher == launch_command.DIRECT:
        env.update(where.ranks or launch_command.single_process_env())
    return interpreter_environment(sys.executable, env)


def command(plan: LaunchPlan, where: Placement, launcher: str, env: dict[str, str]) -> tuple[list[str], str]:
    torchrun = None
    if launcher == launch_command.TORCHRUN:
        torchrun = launch_command.standalone_args(plan.nproc) if where.nnodes == 1 else launch_command.rendezvous_args(
            nnodes=where.nnodes, node_rank=where.node_rank, master_addr=where.master_addr,
            master_port=where.master_port, nproc=plan.nproc)
    return launch_command.command(plan.entrypoint, python=sys.executable, python_names=PYTHON_NAMES, env=env,
                                  torchrun=torchrun)


def supervise(argv: list[str], env: dict[str, str], cwd: Path, tee: Tee) -> tuple[int, str]:
    """Run `argv` in its own process group, its output through `tee`, passing SIGTERM and SIGINT on to the
    group; its exit code (a signal's as a shell gives it, 128 + n) and how it exited."""
    try:
        child = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=die_with_launcher if sys.platform.startswith("linux") else None)
    except OSError as exc:
        return 127, f"cannot start {argv[0]}: {exc.strerror}"
    stopped: list[int] = []

    def forward(signum, _frame):
        stopped.append(signum)
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        pump(child, tee)
        returned = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = 128 - returned if returned < 0 else returned
    how = f"killed by {signal.Signals(-returned).name} (exit code {code})" if returned < 0 else f"exited with code {code}"
    if stopped:
        how = f"stopped by {signal.Signals(stopped[0]).name} sent to the launcher; {how}"
    return code, how


def die_with_launcher() -> None:
    """In the job's process before it starts (Linux): the kernel kills it when the launcher dies, so a launcher
    killed outright (Ray stopping a job past its grace, its job supervisor gone with a node) leaves no job
    process running in a session of its own."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def pump(child: subprocess.Popen, tee: Tee) -> None:
    """Copy the child's output to `tee` as it comes, until the child has exited and its pipe is drained (a
    process it left holding the pipe does not keep the launcher waiting)."""
    fd = child.stdout.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                return
            tee.job(chunk)
        elif child.poll() is not None:
            return


class Tee:
    """The job's output and the launcher's lines, to stdout and (node 0) the synced log: appended to `job.log` as it
    comes on a shared filesystem (Ray), or handed to the publisher's log parts on an object-store mount; keeps
    the end of the job's own output for its last line."""

    def __init__(self, log: Path | None, parts=None):
        self.path, self.parts, self.file, self.tail = log, parts, None, b""

    def __enter__(self) -> Tee:
        if self.path is not None:
            self.file = open(self.path, "ab", buffering=0)
        return self

    def __exit__(self, *_exc) -> None:
        if self.file is not None:
            self.file.close()

    def job(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        self.write(data)

    def say(self, line: str) -> None:
        self.write(f"{PREFIX} {line}\n".encode())

    def write(self, data: bytes) -> None:
        if self.file is not None:
            self.file.write(data)
        if self.parts is not None:
            self.parts.write(data)
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    def last_line(self) -> str:
        """The job's last non-empty line (at most 500 characters), or empty."""
        lines = [line.strip() for line in self.tail.decode(errors="replace").splitlines() if line.strip()]
        return lines[-1][-500:] if lines else ""


if __name__ == "__main__":
    sys.exit(main())

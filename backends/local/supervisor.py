"""The process that owns one local attempt: prepares its Python, runs it, and records how it ended.

The local backend starts it detached (its own session and process group), so the job outlives
the CLI that submitted it. It writes `supervisor.json` (its pid and start time, so any later
process can tell it from a reused pid), touches `heartbeat` every second while it lives, and, when
the job ends for any reason it can see, writes `exit.json` atomically and stops whatever the job
left running (processes.py).

The job's process dies with it: the child is started with a parent-death signal (Linux prctl
PR_SET_PDEATHSIG, SIGTERM, so torchrun still takes its workers down), and the keeper this supervisor
runs under (keeper.py, a child subreaper) stops everything else the job started — grandchildren,
background jobs, double-forked daemons, children in new sessions. If the supervisor is killed
outright there is no `exit.json`; the backend then stops what is left of the attempt and records
the end itself (the last heartbeat, or when it stopped the last process).

`launch.json` holds only what trainmaster decided (the entrypoint as written, the variables it
sets, the spec's `env`); the inherited environment (jobs/inherited.py: an allowlist, never the
broker's secrets) is merged here, at run time, and is never written to disk. The entrypoint is expanded in the job's final environment (`expand_command`).

Kept to the standard library, psutil and small `jobs` modules so it starts in milliseconds.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trainmaster.backends.local import ddp_reason, keeper, oom, processes, sandbox, venv_cache
from trainmaster.jobs import launch_command
from trainmaster.jobs.environment import OUTPUT_DIR, interpreter_environment
from trainmaster.jobs.inherited import inherited
from trainmaster.jobs.process_start import now_since_boot
from trainmaster.jobs.files import write_json_atomic

LAUNCH = "launch.json"
SUPERVISOR = "supervisor.json"
EXIT = "exit.json"
LOG = "job.log"
HEARTBEAT = "heartbeat"
HEARTBEAT_S = 1.0
LEFTOVER_GRACE_S = keeper.GRACE_S
PR_SET_PDEATHSIG = 1
LEFTOVERS = "[trainmaster] the job left"
"""How the log line on processes a job left starts: never taken for the job's own last line."""


def main(workdir: Path) -> int:
    os.umask(0o077)  # what the attempt and its job write under the home is the user's alone (docs/runtime.md)
    launch = json.loads((workdir / LAUNCH).read_text())
    started = time.time()
    record = {**processes.identity(os.getpid()), "started_at": started, "oom_kills": oom.kills()}
    beat = Heartbeat(workdir / HEARTBEAT)
    write_json_atomic(workdir / SUPERVISOR, record)
    stopping: dict[str, str] = {}

    def on_term(signum, _frame):
        stopping["reason"] = "cancelled" if signum == signal.SIGTERM else signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with open(workdir / LOG, "ab", buffering=0) as log:
        python, code, reason = launch["python"], 1, None
        jail = None
        try:
            jail = sandbox.Jail.of(launch["sandbox"], workdir) if launch.get("sandbox") else None
            if jail and launch.get("requirements"):  # pip would run the stranger's build code as root
                raise sandbox.SandboxFailed(sandbox.NO_REQUIREMENTS)
        except (sandbox.SandboxFailed, OSError) as exc:
            python, reason = None, f"cannot confine the job: {exc}"
            log.write(f"[trainmaster] {reason}\n".encode())
        if python is not None and launch.get("requirements"):
            try:
                python = prepare_venv(Path(launch["requirements"]), Path(launch["envs_dir"]), log, beat)
            except EnvironmentFailed as exc:
                python, reason = None, str(exc)
                log.write(f"[trainmaster] {exc}\n".encode())
        if python is not None:
            log.write(f"[trainmaster] python: {python}\n".encode())
            env = interpreter_environment(python, jail.environment(launch["env"]) if jail
                                          else {**inherited(os.environ, launch.get("inherit", ())), **launch["env"]})
            if launch["launcher"] == launch_command.TORCHRUN:
                (workdir / ddp_reason.RANKS_DIR).mkdir(exist_ok=True)
            if jail:
                jail.hand_over()
                log.write(f"[trainmaster] confined: user {jail.uid}, network {'kept' if jail.settings.get('network') else 'none'}\n".encode())
            result = run(*command(launch, python, env), launch, env, log, stopping, beat, jail)
            code = 124 if result == "timeout" else result
            reason = stopping.get("reason") or (_limit_reached(launch) if result == "timeout" else None)
        finish(workdir, started, code, reason, stopping, oom_kills=record["oom_kills"])
        stop_leftovers(record, launch, log, stopping)
        if jail:
            jail.take_back()
    return 0


def _limit_reached(launch: dict) -> str:
    """The reason of a run its time limit stopped: the cost cap when that is what the limit was (backend.py
    `time_limit`), else the wall-clock limit."""
    limit = launch.get("time_limit") or ""
    if "limits.max_usd" in limit:
        return f"cost cap reached: {limit}"
    return f"time limit reached: {limit}"


class Heartbeat:
    """Writes a file at most once a second: its mtime is when the supervisor was last seen alive, and it holds the
    same moment in seconds since boot (`processes.heartbeat_since_boot`), which no step of the wall clock moves."""

    def __init__(self, path: Path):
        self.path, self.last = path, time.time()
        self._write()

    def __call__(self) -> None:
        if time.time() - self.last >= HEARTBEAT_S:
            self.last = time.time()
            self._write()

    def _write(self) -> None:
        since_boot = now_since_boot()
        try:
            if since_boot is not None:
                self.path.write_text(f"{since_boot:.3f}")
                return
        except OSError:  # a full disk: the beat must go on, as an mtime (an empty file reads as the wall clock's)
            pass
        self.path.touch()


def command(launch: dict, python: str, env: dict[str, str]) -> tuple[list[str], str]:
    """The argv to start, and the line the log shows (jobs/launch_command.py); under torchrun every rank's output
    is also kept apart, for the reason of a failure (ddp_reason.py)."""
    torchrun = None
    if launch["launcher"] == launch_command.TORCHRUN:
        torchrun = launch_command.standalone_args(launch["nproc"]) + ddp_reason.torchrun_args(Path(launch["cwd"]).parent)
    return launch_command.command(launch["entrypoint"], python=python, python_names=launch["python_names"], env=env,
                                  torchrun=torchrun)


def run(argv: list[str], shown: str, launch: dict, env: dict[str, str], log, stopping: dict, beat: Heartbeat,
        jail: sandbox.Jail | None = None) -> int | str:
    log.write(f"[trainmaster] $ {shown}\n".encode())
    try:
        child = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 **start_in(launch["cwd"], jail))
    except OSError as exc:
        log.write(f"[trainmaster] cannot start {argv[0]}: {exc}\n".encode())
        return 127
    deadline = time.time() + launch["max_seconds"] if launch.get("max_seconds") else None
    while (code := wait(child, beat, HEARTBEAT_S)) is None:
        if deadline and time.time() > deadline and not stopping:
            log.write(f"[trainmaster] {_limit_reached(launch)}; stopping the job\n".encode())
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the signal is for the job, not for us
            os.killpg(os.getpgid(0), signal.SIGTERM)
            if wait(child, beat, 30) is None:
                child.kill()
                child.wait()
            return "timeout"
    return code


def wait(proc: subprocess.Popen, beat: Heartbeat, timeout: float) -> int | None:
    """`proc`'s exit code, or None after `timeout` seconds; the heartbeat goes on meanwhile."""
    deadline = time.time() + timeout
    while True:
        try:
            return proc.wait(timeout=max(0.0, min(HEARTBEAT_S, deadline - time.time())))
        except subprocess.TimeoutExpired:
            beat()
            if time.time() >= deadline:
                return None


def start_in(cwd: str, jail: sandbox.Jail | None) -> dict:
    """Popen's `cwd` and `preexec_fn`: a confined job enters its folder only once its view is made."""
    if jail is None:
        return {"cwd": cwd, "preexec_fn": die_with_parent()}
    return {"cwd": None, "preexec_fn": jail.enter(cwd, die_with_parent())}


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` arming the child's parent-death signal (Linux): it gets SIGTERM when this
    supervisor dies, however it dies; None where there is no prctl. The supervisor has no threads,
    so a preexec_fn is safe here."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent, sig = os.getpid(), int(signal.SIGTERM)

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the supervisor died before the signal was armed
            os.kill(os.getpid(), sig)

    return arm


def call(argv: list[str], log, beat: Heartbeat) -> int:
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=die_with_parent())
    while (code := wait(proc, beat, HEARTBEAT_S)) is None:
        pass
    return code


class EnvironmentFailed(Exception):
    """The job's virtualenv could not be made; the message is the attempt's reason."""


_IN_USE: list = []
"""The lock file of the virtualenv this supervisor's job runs with, held shared for its life (venv_cache.py)."""


def prepare_venv(requirements: Path, envs_dir: Path, log, beat: Heartbeat) -> str:
    """A virtualenv with the requirements installed on top of this environment, cached by their hash and
    rebuilt when the versions it holds fixed change (venv_cache.HELD: the broker's torch and what the runtime imports).

    The broker's own site-packages are linked in (a .pth file), the way a cloud image carries
    torch: requirements add to it rather than reinstalling multi-GB frameworks per job, and a pip
    constraints file keeps them from replacing it. Every console script of the base environment gets
    a wrapper in the virtualenv's `bin` (`pip`, `accelerate`, `torchrun` …), so on `PATH` they run the
    virtualenv's python, as installing them there would have. Built in place under an exclusive lock
    (a console script names its interpreter by absolute path, so a virtualenv cannot be moved once
    built), then used under a shared one, held until this supervisor exits. Raises EnvironmentFailed.
    """
    held = venv_cache.held_versions()
    pins = venv_cache.constraints(held)
    venv = envs_dir / venv_cache.venv_key(requirements.read_bytes())
    envs_dir.mkdir(parents=True, exist_ok=True)
    lock = open(venv_cache.lock_path(venv), "a")
    _IN_USE.append(lock)
    while True:
        _wait_for_lock(lock, fcntl.LOCK_SH, beat)
        if venv_cache.is_current(venv, pins):
            os.utime(venv / venv_cache.READY)  # its last use, which `trainmaster gc` keeps the newest by
            return str(venv / "bin" / "python")
        _wait_for_lock(lock, fcntl.LOCK_EX, beat)  # another job may be building it, or gc removing it
        if not venv_cache.is_current(venv, pins):
            _build_venv(venv, requirements, pins, held, log, beat)


def _wait_for_lock(lock, mode: int, beat: Heartbeat) -> None:
    while not venv_cache.try_lock(lock, mode):
        beat()
        time.sleep(0.2)


def _build_venv(venv: Path, requirements: Path, pins: str, held: dict[str, str], log, beat: Heartbeat) -> None:
    (venv / venv_cache.READY).unlink(missing_ok=True)
    shutil.rmtree(venv, ignore_errors=True)  # a build that died half-way, or one made under other versions
    kept = ", ".join(f"{name} {version}" for name, version in sorted(held.items()))
    log.write(f"[trainmaster] preparing environment {venv} from {requirements.name}, keeping the broker's {kept}\n".encode())
    if call([sys.executable, "-m", "venv", "--without-pip", str(venv)], log, beat):
        raise EnvironmentFailed("creating the job's virtualenv failed; see the log")
    python = str(venv / "bin" / "python")
    site = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   text=True).strip()
    parent = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "_trainmaster_base.pth").write_text("\n".join(parent) + "\n")
    (venv / venv_cache.CONSTRAINTS).write_text(pins)
    start = log.tell()
    install = [python, "-m", "pip", "install", "--disable-pip-version-check", "-r", str(requirements),
               "-c", str(venv / venv_cache.CONSTRAINTS)]
    if call(install, log, beat) != 0:
        output = _read_from(Path(log.name), start)
        conflict = venv_cache.conflict_reason(output, held)
        raise EnvironmentFailed(f"installing the requirements failed: {conflict or venv_cache.pip_error(output)}")
    venv_cache.link_console_scripts(python, venv / "bin")
    (venv / venv_cache.READY).touch()


def _read_from(path: Path, offset: int, most: int = 2**16) -> str:
    """The last `most` bytes of `path` after `offset`, as text."""
    with open(path, "rb") as f:
        f.seek(max(offset, f.seek(0, os.SEEK_END) - most))
        return f.read().decode(errors="replace")


def finish(workdir: Path, started: float, code: int, reason: str | None, stopping: dict, *,
           oom_kills: int | None = None) -> None:
    """Record the end; `oom_killed` says whether the kernel's OOM killer took the job (None: cannot tell)."""
    write_json_atomic(workdir / EXIT, {"exit_code": code, "reason": reason, "cancelled": stopping.get("reason") == "cancelled",
                                       "started_at": started, "ended_at": time.time(),
                                       "oom_killed": oom.killed_for_memory(code, oom_kills, oom.kills())})


def stop_leftovers(record: dict, launch: dict, log, stopping: dict) -> None:
    """Stop what the job left running once it ended (a daemon it forked, workers its launcher lost):
    SIGTERM, up to LEFTOVER_GRACE_S to exit (cut short by a cancel), then SIGKILL."""
    left = processes.attempt_processes(record, marker=launch["env"][OUTPUT_DIR],
                                       until=None, exclude={os.getpid()})
    if left:
        log.write(f"{LEFTOVERS} {len(left)} process(es) running "
                  f"(pid {', '.join(str(p.pid) for p in left)}); stopping them\n".encode())
        processes.stop(left, grace=0 if stopping else LEFTOVER_GRACE_S, interrupted=lambda: bool(stopping))


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

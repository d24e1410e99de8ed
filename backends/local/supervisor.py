"""The process that owns one local attempt: prepares its Python, runs it, and records how it ended.

The local backend starts it detached (its own session and process group), so the job outlives
the CLI that submitted it. It writes `supervisor.json` (its pid and start time, so any later
process can tell it from a reused pid) and, when the job ends for any reason it can see,
`exit.json` atomically. If it is killed outright there is no `exit.json`, and the backend
reports the attempt as failed: "the process died without finishing".

Kept to the standard library, psutil and `jobs.files` so it starts in milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainmaster.jobs.files import write_json_atomic

LAUNCH = "launch.json"
SUPERVISOR = "supervisor.json"
EXIT = "exit.json"
LOG = "job.log"


def process_start_time(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


def main(workdir: Path) -> int:
    launch = json.loads((workdir / LAUNCH).read_text())
    started = time.time()
    write_json_atomic(workdir / SUPERVISOR, {"pid": os.getpid(), "create_time": process_start_time(os.getpid()),
                                             "started_at": started})
    stopping: dict[str, str] = {}

    def on_term(signum, _frame):
        stopping["reason"] = "cancelled" if signum == signal.SIGTERM else signal.Signals(signum).name

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    with open(workdir / LOG, "ab", buffering=0) as log:
        argv = launch["argv"]
        if launch.get("requirements"):
            python = prepare_venv(Path(launch["requirements"]), Path(launch["envs_dir"]), log)
            if python is None:
                return finish(workdir, started, 1, "installing the requirements failed; see the log", stopping)
            argv = [python if a == launch["python"] else a for a in argv]
        code = run(argv, launch, log, stopping)
    reason = stopping.get("reason") or ("time limit reached" if code == "timeout" else None)
    return finish(workdir, started, 124 if code == "timeout" else code, reason, stopping)


def run(argv: list[str], launch: dict, log, stopping: dict) -> int | str:
    log.write(f"[trainmaster] $ {' '.join(argv)}\n".encode())
    try:
        child = subprocess.Popen(argv, cwd=launch["cwd"], env=launch["env"], stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    except OSError as exc:
        log.write(f"[trainmaster] cannot start {argv[0]}: {exc}\n".encode())
        return 127
    deadline = time.time() + launch["max_seconds"] if launch.get("max_seconds") else None
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if deadline and time.time() > deadline and not stopping:
                log.write(b"[trainmaster] time limit reached; stopping the job\n")
                signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the signal is for the job, not for us
                os.killpg(os.getpgid(0), signal.SIGTERM)
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                return "timeout"


def prepare_venv(requirements: Path, envs_dir: Path, log) -> str | None:
    """A virtualenv with the requirements installed on top of this environment, cached by their hash.

    The broker's own site-packages are linked in (a .pth file), the way a cloud image carries
    torch: requirements add to it rather than reinstalling multi-GB frameworks per job.
    """
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    venv = envs_dir / digest
    python = venv / "bin" / "python"
    if (venv / ".ready").exists():
        return str(python)
    tmp = envs_dir / f".{digest}.{os.getpid()}"
    log.write(f"[trainmaster] preparing environment {venv} from {requirements.name}\n".encode())
    if subprocess.call([sys.executable, "-m", "venv", "--without-pip", str(tmp)], stdout=log, stderr=subprocess.STDOUT):
        return None
    site = subprocess.check_output([str(tmp / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   text=True).strip()
    parent = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "_trainmaster_base.pth").write_text("\n".join(parent) + "\n")
    install = [str(tmp / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-r", str(requirements)]
    if subprocess.call(install, stdout=log, stderr=subprocess.STDOUT) != 0:
        return None
    (tmp / ".ready").touch()
    try:
        os.rename(tmp, venv)
    except OSError:  # another job built the same environment first; use that one
        shutil.rmtree(tmp, ignore_errors=True)
    return str(python)


def finish(workdir: Path, started: float, code: int, reason: str | None, stopping: dict) -> int:
    write_json_atomic(workdir / EXIT, {"exit_code": code, "reason": reason, "cancelled": stopping.get("reason") == "cancelled",
                                       "started_at": started, "ended_at": time.time()})
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

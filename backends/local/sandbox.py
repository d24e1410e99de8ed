"""Confining a job of a stranger on this machine: its own unprivileged user, its own view of the files,
resource limits, a scrubbed environment and, unless the sandbox keeps it, no network (docs/security.md,
"Jobs of strangers"). Used by the supervisor when the local backend's `sandbox` is set (a Bittensor miner
running other people's training code); needs root, which is given up in the job's process before it execs.

- **Its user**: `uid`/`gid` as configured, else a user of the attempt's own (`FIRST_UID` + the first free
  slot: its lock file under `SLOT_LOCKS` is held for the supervisor's life and no process runs as it),
  so no two jobs share one and one job cannot signal, trace or read another.
- **Its files** (mount_view.py): the miner's home, the paths `hide` names and every folder on the way to
  a needed one that others may not pass through are empty; the interpreter's prefixes and trainmaster's
  code come back read-only, the work dir read-write, and all else is read-only. The work dir stays root's
  (traversable, 0711: the supervisor's records in it are not the job's), its `code/`, `outputs/`,
  `checkpoints/` and `scratch/` (the job's HOME and TMPDIR) are handed to the job's user before it starts
  and taken back (root's again) once it and what it left have stopped.
- **Its limits**: address space, open files, processes of its user, file size, no core dumps;
  `PR_SET_NO_NEW_PRIVS`, so no set-user-ID program gives privileges back; umask 077.
- **Its environment**: PATH, LANG, HOME, TMPDIR and the variables trainmaster sets for the job; nothing
  else of the miner's.

Runs in a `preexec_fn`: safe because the supervisor has no threads. The parent-death signal is armed after
the user changes (a change of credentials clears it). Standard library and psutil only.
"""

from __future__ import annotations

import fcntl
import os
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainmaster.backends.local import mount_view

FIRST_UID = 2_000_000
SLOTS = 100_000
SLOT_LOCKS = Path("/run/trainmaster/job-users")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
JOB_DIRS = ("code", "outputs", "checkpoints", "scratch", "ranks")  # ranks: torchrun's per-rank logs (ddp_reason.py)
PR_SET_NO_NEW_PRIVS = 38
NEEDS_ROOT = "confining jobs needs root (it drops each job to its own unprivileged user)"
NO_REQUIREMENTS = ("a confined job cannot have `environment: requirements` yet (its virtualenv would be built "
                   "unconfined); use `environment: current`")
PACKAGE = str(Path(__file__).resolve().parents[2])
"""trainmaster's own code, which the job's runtime imports."""

_HELD: list = []
"""The lock file of the job user's slot, held for the supervisor's life."""


def cannot_confine() -> str | None:
    """Why jobs cannot be confined here (None when they can)."""
    if not sys.platform.startswith("linux"):
        return "confining jobs needs Linux (mount namespaces)"
    return NEEDS_ROOT if os.geteuid() != 0 else None


class SandboxFailed(Exception):
    """The job could not be confined; the message is the attempt's reason."""


@dataclass
class Jail:
    """One attempt's confinement, as launch.json's `sandbox` (config.Sandbox's fields) asks for it."""

    settings: dict
    workdir: Path
    uid: int = 0
    gid: int = 0
    needed: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, settings: dict, workdir: Path) -> Jail:
        if reason := cannot_confine():
            raise SandboxFailed(reason)
        uid = settings.get("uid") or take_free_uid()
        jail = cls(settings, Path(os.path.realpath(workdir)), uid, settings.get("gid") or uid)
        jail.needed = needed_folders(jail.homes())
        return jail

    def homes(self) -> list[str]:
        """The miner's home: the supervisor's user's, and $HOME."""
        import pwd

        found = {pwd.getpwuid(os.geteuid()).pw_dir, os.environ.get("HOME", "/")}
        return sorted(os.path.realpath(h) for h in found if h and os.path.realpath(h) != "/")

    @property
    def scratch(self) -> Path:
        return self.workdir / "scratch"

    def environment(self, launch_env: dict[str, str]) -> dict[str, str]:
        """The job's whole environment: nothing inherited from the miner but its LANG."""
        base = {"PATH": DEFAULT_PATH, "LANG": os.environ.get("LANG", "C.UTF-8"),
                "HOME": str(self.scratch), "TMPDIR": str(self.scratch)}
        return {**base, **launch_env}

    def hand_over(self) -> None:
        """The job's folders to its user; the work dir itself stays root's, passable."""
        self.scratch.mkdir(mode=0o700, exist_ok=True)
        self.workdir.chmod(0o711)
        for name in JOB_DIRS:
            chown_tree(self.workdir / name, self.uid, self.gid)

    def take_back(self) -> None:
        """Everything the job's user wrote is root's again (a later job given the same user finds nothing)."""
        for name in JOB_DIRS:
            chown_tree(self.workdir / name, 0, 0)

    def covers(self) -> list[str]:
        """What the job sees empty: the homes, the hidden paths, and each folder on the way to a needed one
        that others may not pass through."""
        blockers = [b for path in [*self.needed, str(self.workdir)] if (b := closed_ancestor(path))]
        return sorted({*self.homes(), *self.hidden(), *blockers})

    def hidden(self) -> list[str]:
        return [os.path.realpath(p) for p in self.settings.get("hide", [])]

    def enter(self, cwd: str, then: Callable[[], None] | None) -> Callable[[], None]:
        """The `preexec_fn` confining the child, then running `then` (the parent-death signal) as the job's user."""
        view = {"read_only": self.needed, "writable": str(self.workdir), "covers": self.covers(),
                "hide": self.hidden(), "network": bool(self.settings.get("network"))}

        def confine() -> None:
            try:
                os.umask(0o022)
                mount_view.make(**view)
                os.chdir(cwd)  # after the view is made: a directory entered before would lead past the covers
                self._limit()
                os.setgroups([])
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
                os.umask(0o077)
                _prctl(PR_SET_NO_NEW_PRIVS, 1)
            except OSError as exc:
                os.write(2, f"[trainmaster] cannot confine the job: {exc}\n".encode())
                raise
            if then:
                then()

        return confine

    def _limit(self) -> None:
        s = self.settings
        limits = [(resource.RLIMIT_NOFILE, s.get("open_files", 4096)), (resource.RLIMIT_NPROC, s.get("processes", 512)),
                  (resource.RLIMIT_FSIZE, s.get("file_size_gb", 64) * 2**30), (resource.RLIMIT_CORE, 0)]
        if s.get("memory_mb"):
            limits.append((resource.RLIMIT_AS, s["memory_mb"] * 2**20))
        for which, value in limits:
            resource.setrlimit(which, (value, value))


def needed_folders(homes: list[str]) -> list[str]:
    """What a job's Python needs to see: the interpreter's prefixes, the folders on its path, trainmaster's
    code; never a home itself or a folder holding one."""
    found = {sys.base_prefix, sys.prefix, sys.exec_prefix, PACKAGE, *(p for p in sys.path if p and os.path.isdir(p))}
    real = {os.path.realpath(p) for p in found}
    return sorted(p for p in real if os.path.isabs(p) and os.path.isdir(p)
                  and not any(mount_view.inside(h, p) for h in homes) and p != os.path.realpath(os.getcwd()))


def closed_ancestor(path: str) -> str | None:
    """The topmost folder above `path` that others may not pass through (no o+x), or None."""
    parts = Path(path).parts
    for n in range(2, len(parts)):
        folder = os.path.join(*parts[:n])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def take_free_uid() -> int:
    """The first job user whose slot lock is free and as whom nothing runs; its lock is held from now on."""
    import psutil

    SLOT_LOCKS.mkdir(mode=0o700, parents=True, exist_ok=True)
    busy = set()
    for proc in psutil.process_iter(["uids"]):
        if proc.info["uids"]:
            busy.add(proc.info["uids"].real)
    for uid in range(FIRST_UID, FIRST_UID + SLOTS):
        if uid in busy:
            continue
        lock = open(SLOT_LOCKS / f"{uid}.lock", "a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        _HELD.append(lock)
        return uid
    raise SandboxFailed(f"no free job user in {FIRST_UID}…{FIRST_UID + SLOTS - 1}")


def chown_tree(root: Path, uid: int, gid: int) -> None:
    """`root` and all below it to uid:gid, links themselves, never followed."""
    if not root.exists() or root.is_symlink():
        return
    os.chown(root, uid, gid, follow_symlinks=False)
    for here, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(here, name), uid, gid, follow_symlinks=False)


def _prctl(option: int, value: int) -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")

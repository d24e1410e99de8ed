"""Job virtualenvs (`environment: python: requirements`) as files: their key, what they hold fixed, their lock.

A job's virtualenv is built on top of the broker's environment (its site-packages linked in), so it
inherits the broker's torch. Its requirements are installed with that torch, and the libraries
trainmaster's runtime runs on inside the job, held at the broker's versions (a pip constraints file,
`HELD`): a requirement that needs another torch fails the install up front, with the conflict named
(`conflict_reason`), instead of pulling a second torch into the job.

Each virtualenv `<envs dir>/<key>/` (the requirements' hash; `constraints.txt` in it says what it holds
fixed, and one built under other versions is rebuilt in place) has a lock file `<envs dir>/.<key>.lock`: exclusive while it is
built, shared by every supervisor whose job runs with it (held until that supervisor exits, however it
exits). `trainmaster gc` removes one only when it can take the lock exclusively (`remove_unused`), so
an environment in use is never removed. `.ready` marks a finished build; its mtime is the last use.

Standard library and `jobs/venvs.py` only: the supervisor imports it.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import re
import shlex
import shutil
from pathlib import Path

from trainmaster.jobs.venvs import READY, venv_key  # noqa: F401 — the key the verifier finds the environment by again

HELD = ("torch", "numpy", "safetensors", "pydantic")
"""Kept at the broker's versions in a job environment: torch, and what trainmaster's runtime imports in the job."""
CONSTRAINTS = "constraints.txt"


def held_versions() -> dict[str, str]:
    """The installed version of each `HELD` package this environment has."""
    found = {}
    for name in HELD:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def constraints(held: dict[str, str]) -> str:
    return "".join(f"{name}=={version}\n" for name, version in sorted(held.items()))


def is_current(venv: Path, constraints_text: str) -> bool:
    """Built, and built holding the versions held now (a broker whose torch changed rebuilds its environments)."""
    try:
        return (venv / READY).exists() and (venv / CONSTRAINTS).read_text() == constraints_text
    except OSError:
        return False


def lock_path(venv: Path) -> Path:
    return venv.parent / f".{venv.name}.lock"


def try_lock(lock, mode: int) -> bool:
    """Take `mode` (fcntl.LOCK_SH or LOCK_EX) on an open lock file without waiting."""
    try:
        fcntl.flock(lock, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def remove_unused(venv: Path) -> bool:
    """Remove the virtualenv unless a job uses it or it is being built (its lock is held); whether it was."""
    with open(lock_path(venv), "a") as lock:
        if not try_lock(lock, fcntl.LOCK_EX):
            return False
        (venv / READY).unlink(missing_ok=True)  # first: a half-removed environment is never taken for a built one
        shutil.rmtree(venv, ignore_errors=True)
    return True


_DEPENDS = re.compile(r"^\s*(?P<who>\S+ \S+) depends on (?P<what>(?P<name>[A-Za-z0-9_.-]+)\S*)", re.MULTILINE)


def conflict_reason(pip_output: str, held: dict[str, str]) -> str | None:
    """Why pip could not install the requirements, when it is a held package: which requirement needs
    what, what the job environment keeps, and what to do. None when pip's output names no such conflict."""
    wanted = {name.lower().replace("_", "-") for name in held}
    conflicts = [m for m in _DEPENDS.finditer(pip_output) if m["name"].lower().replace("_", "-") in wanted]
    if not conflicts:
        return None
    names = sorted({m["name"].lower().replace("_", "-") for m in conflicts})
    kept = ", ".join(f"{n} {held[n]}" for n in names if n in held)
    needs = "; ".join(sorted({f"{m['who']} depends on {m['what']}" for m in conflicts}))
    example = f" (e.g. the torchvision release made for torch {held['torch']})" if "torch" in names else ""
    return (f"the requirements conflict with the broker's {kept}: {needs}. A job environment is installed on "
            f"top of the broker's {kept} and never replaces it: require versions built for it{example}, or "
            f"install the {' and '.join(names)} you need into the broker's own environment")


def pip_error(pip_output: str, most: int = 300) -> str:
    """pip's last `ERROR:` line (what it could not do), cut to `most` characters; a pointer to the log
    when it printed none."""
    errors = [line.strip() for line in pip_output.splitlines() if line.strip().startswith("ERROR:")]
    return errors[-1][:most] + " (the job's log has pip's full output)" if errors else "see the job's log"


def link_console_scripts(python: str, bindir: Path) -> None:
    """A wrapper in `bindir` running `python` for each console script of this environment it lacks."""
    for ep in importlib.metadata.entry_points(group="console_scripts"):
        target = bindir / ep.name
        if "/" in ep.name or ep.name.startswith(".") or not ep.attr or target.exists():
            continue
        target.write_text(_script_head(python) + f"import sys\nfrom {ep.module} import {ep.attr.split('.')[0]}\n"
                          f"if __name__ == '__main__':\n    sys.exit({ep.attr}())\n")
        target.chmod(0o755)


def _script_head(python: str) -> str:
    """A shebang for `python`; through /bin/sh when the path is too long or odd for the kernel (as pip does)."""
    if len(python) < 127 and not any(c.isspace() for c in python):
        return f"#!{python}\n"
    return f"#!/bin/sh\n'''exec' {shlex.quote(python)} \"$0\" \"$@\"\n' '''\n"

"""What a job about to be submitted (or dry-run) must also satisfy, beyond its file: checks that hold
only at submission, so a stored spec read again later (`verify --spec`, a resume) is not held to them.

- the entrypoint's script lies inside the code directory (the bundle), not beside or above it;
- a bare command (`accelerate launch …`) is found on the job's PATH (the broker's interpreter's `bin`
  first, as the local backend runs it), unless a requirements environment may provide it;
- `limits.deadline` is not already past.
"""

from __future__ import annotations

import os
import shutil
import sys
from datetime import datetime, timezone

from trainmaster.jobs.spec import PYTHON_NAMES, LoadedSpec, entry_script


def launch_problems(loaded: LoadedSpec, now: datetime | None = None) -> list[str]:
    """One `file: field: why` line per problem; empty when the job may be submitted."""
    found = [_outside_bundle(loaded), _not_on_path(loaded), _deadline_past(loaded, now or datetime.now(timezone.utc))]
    return [f"{loaded.path}: {problem}" for problem in found if problem]


def _outside_bundle(loaded: LoadedSpec) -> str | None:
    script = entry_script(loaded.spec.argv)
    if script is None:
        return None
    resolved = (loaded.code_dir / script).resolve()
    if resolved.is_relative_to(loaded.code_dir):
        return None
    return (f"entrypoint: {script} is outside the code directory {loaded.code_dir}, so it would not be in the "
            "job's bundle; move it into the code directory or point code: at a folder that holds it")


def _not_on_path(loaded: LoadedSpec) -> str | None:
    spec = loaded.spec
    command = spec.argv[0]
    if (command in PYTHON_NAMES or "/" in command or "$" in command or entry_script(spec.argv) is not None
            or spec.environment.python == "requirements"):  # a requirements environment may install it
        return None
    path = os.pathsep.join([os.path.dirname(os.path.abspath(sys.executable)), os.environ.get("PATH", os.defpath)])
    if shutil.which(command, path=path):
        return None
    return (f"entrypoint: the command {command!r} is not on the job's PATH; install it in the broker's "
            "environment, run it through python (`python -m …`), or set environment.python: requirements "
            "with a requirements file that installs it")


def _deadline_past(loaded: LoadedSpec, now: datetime) -> str | None:
    deadline = loaded.spec.limits.deadline
    if deadline is None:
        return None
    aware = deadline if deadline.tzinfo else deadline.replace(tzinfo=timezone.utc)
    if aware > now:
        return None
    return f"limits.deadline: {aware.isoformat()} is already past (it is now {now.isoformat(timespec='seconds')})"

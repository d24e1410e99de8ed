"""The job environment: the only coupling between a backend and the code running inside a job.

Every backend sets these variables before it starts the entrypoint; `jobs.runtime` reads them.
torchrun adds its own `RANK`, `WORLD_SIZE` and `LOCAL_RANK`. Rank 0 alone writes checkpoints
and the commitment.

Also here, so a backend and the verifier treat a command alike: how an entrypoint (or an
evaluator) becomes an argv in the job's environment (`expand_command`), how an interpreter's
virtualenv is put first on `PATH` (`interpreter_environment`), and the record of the interpreter
a job ran with, which the evaluator then runs with too (`record_python`, `recorded_python`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from trainmaster.jobs.files import HostileFile, read_regular, write_json_atomic

JOB_ID = "TRAINMASTER_JOB_ID"
OUTPUT_DIR = "TRAINMASTER_OUTPUT_DIR"
CHECKPOINT_DIR = "TRAINMASTER_CHECKPOINT_DIR"
RESUME_FROM = "TRAINMASTER_RESUME_FROM"
SEED = "TRAINMASTER_SEED"
SEGMENT_STEPS = "TRAINMASTER_SEGMENT_STEPS"
BUNDLE_SHA256 = "TRAINMASTER_BUNDLE_SHA256"

ALL = (JOB_ID, OUTPUT_DIR, CHECKPOINT_DIR, RESUME_FROM, SEED, SEGMENT_STEPS, BUNDLE_SHA256)


def job_environment(
    *,
    job_id: str,
    output_dir: Path,
    checkpoint_dir: Path,
    seed: int,
    segment_steps: int,
    bundle_sha256: str,
    resume_from: Path | None = None,
) -> dict[str, str]:
    """The variables a backend sets for one attempt of a job (strings, ready for `os.environ`)."""
    return {
        JOB_ID: job_id,
        OUTPUT_DIR: str(output_dir),
        CHECKPOINT_DIR: str(checkpoint_dir),
        RESUME_FROM: str(resume_from) if resume_from else "",
        SEED: str(seed),
        SEGMENT_STEPS: str(segment_steps),
        BUNDLE_SHA256: bundle_sha256,
    }


ENVIRONMENT_RECORD = "environment.json"
"""In an attempt's work dir: the interpreter the job ran with (written by the backend that ran it)."""
MAX_RECORD_BYTES = 2**16
"""The record is one interpreter path; read bounded, as the job runs beside it."""

_VARIABLE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def expand_command(command: str, env: Mapping[str, str]) -> list[str]:
    """The argv a command runs as: split into words as a POSIX shell would (`shlex.split`), then
    `$NAME` and `${NAME}` in each word replaced from `env`, the job's own environment.

    Like `os.path.expandvars`, a name `env` lacks is left as written, and quotes group words but do
    not stop expansion. There is no globbing, `~`, command substitution or pipe: for those, run a
    shell (`bash -c '…'`), which expands its own variables in the same environment.
    """
    return [_VARIABLE.sub(lambda m: env.get(m[1] or m[2], m[0]), word) for word in shlex.split(command)]


def interpreter_environment(python: str, env: Mapping[str, str]) -> dict[str, str]:
    """`env` with `python`'s virtualenv activated as `source bin/activate` would (its `bin` first
    on `PATH`, `VIRTUAL_ENV` set, `PYTHONHOME` unset), so `python`, `pip`, `accelerate` and a
    `bash -c 'python …'` all resolve to it. An interpreter outside a virtualenv leaves `env` as is."""
    out = dict(env)
    bindir = os.path.dirname(os.path.abspath(python))
    root = os.path.dirname(bindir)
    if os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        out["VIRTUAL_ENV"] = root
        out["PATH"] = os.pathsep.join([bindir, *[p for p in out.get("PATH", os.defpath).split(os.pathsep) if p != bindir]])
        out.pop("PYTHONHOME", None)
    return out


def record_python(workdir: Path, python: str) -> None:
    write_json_atomic(Path(workdir) / ENVIRONMENT_RECORD, {"python": python})


def recorded_python(workdir: Path) -> str | None:
    """The interpreter an attempt ran with, when the backend that ran it recorded one."""
    try:
        return json.loads(read_regular(Path(workdir) / ENVIRONMENT_RECORD, MAX_RECORD_BYTES))["python"]
    except (OSError, ValueError, KeyError, TypeError, HostileFile):  # the job runs beside it: it may have replaced it
        return None

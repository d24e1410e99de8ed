"""The job environment: the only coupling between a backend and the code running inside a job.

Every backend sets these variables before it starts the entrypoint; `jobs.runtime` reads them.
torchrun adds its own `RANK`, `WORLD_SIZE` and `LOCAL_RANK`. Rank 0 alone writes checkpoints
and the commitment.

Also here, so a backend and the verifier treat a command alike: how an entrypoint (or an
evaluator) becomes an argv in the job's environment (`expand_command`), how an interpreter's
virtualenv is put first on `PATH` (`interpreter_environment`).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import Checkpointing

JOB_ID = "TRAINMASTER_JOB_ID"
OUTPUT_DIR = "TRAINMASTER_OUTPUT_DIR"
CHECKPOINT_DIR = "TRAINMASTER_CHECKPOINT_DIR"
RESUME_FROM = "TRAINMASTER_RESUME_FROM"
SEED = "TRAINMASTER_SEED"
SEGMENT_STEPS = "TRAINMASTER_SEGMENT_STEPS"
BUNDLE_SHA256 = "TRAINMASTER_BUNDLE_SHA256"
KEEP_EVERY = "TRAINMASTER_KEEP_EVERY"
MAX_DISK_GB = "TRAINMASTER_MAX_DISK_GB"
SELFCHECK = "TRAINMASTER_SELFCHECK"

ALL = (JOB_ID, OUTPUT_DIR, CHECKPOINT_DIR, RESUME_FROM, SEED, SEGMENT_STEPS, BUNDLE_SHA256, KEEP_EVERY, MAX_DISK_GB,
       SELFCHECK)


def job_environment(
    *,
    job_id: str,
    output_dir: Path,
    checkpoint_dir: Path,
    seed: int,
    segment_steps: int,
    bundle_sha256: str,
    resume_from: Path | None = None,
    keep_every: int = 1,
    max_disk_gb: float | None = None,
    selfcheck: bool = True,
) -> dict[str, str]:
    """The variables a backend sets for one attempt of a job (strings, ready for `os.environ`)."""
    return {
        JOB_ID: job_id,
        OUTPUT_DIR: str(output_dir),
        CHECKPOINT_DIR: str(checkpoint_dir),
        RESUME_FROM: str(resume_from) if resume_from else "",
        SEED: str(seed),
        BUNDLE_SHA256: bundle_sha256,
        **checkpoint_environment(segment_steps=segment_steps, keep_every=keep_every, max_disk_gb=max_disk_gb,
                                 selfcheck=selfcheck),
    }


def checkpoint_environment(*, segment_steps: int, keep_every: int = 1, max_disk_gb: float | None = None,
                           selfcheck: bool = True) -> dict[str, str]:
    """The spec's `checkpoint:` section as the runtime reads it. Every backend sends all four (the managed clouds
    and Ray beside the job id, seed and bundle hash, their launcher setting the folders on the executor's side),
    so `keep_every`, `max_disk_gb` and `selfcheck: false` mean the same wherever the job runs."""
    return {
        SEGMENT_STEPS: str(segment_steps),
        KEEP_EVERY: str(keep_every),
        MAX_DISK_GB: "" if max_disk_gb is None else repr(float(max_disk_gb)),
        SELFCHECK: "1" if selfcheck else "0",
    }


def spec_checkpoint_environment(checkpoint: Checkpointing) -> dict[str, str]:
    """`checkpoint_environment` of a spec's `checkpoint:` section."""
    return checkpoint_environment(segment_steps=checkpoint.segment_steps, keep_every=checkpoint.keep_every,
                                  max_disk_gb=checkpoint.max_disk_gb, selfcheck=checkpoint.selfcheck)


_VARIABLE = re.compile(r"\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")


def expand_command(command: str, env: Mapping[str, str]) -> list[str]:
    """The argv a command runs as: split into words as a POSIX shell would (`shlex.split`), then
    `$NAME` and `${NAME}` in each word replaced from `env`, the job's own environment, except in a
    shell's script (`bash -c SCRIPT`, `sh -ec SCRIPT`, `env zsh -c SCRIPT`; `_shell_scripts`).

    Like `os.path.expandvars`, a name `env` lacks is left as written, and quotes group words but do
    not stop expansion. A shell's script is left exactly as written: the shell expands its own
    variables from the same environment, and quoting works there as in any shell, so a value holding
    `$(…)` or backticks stays text in `"$VAR"`. Pasting the value into the script text first would run it.
    There is no globbing, `~`, command substitution or pipe outside a shell: for those, run one.
    """
    words = shlex.split(command)
    expanded = [_expand(word, env) for word in words]
    scripts = _shell_scripts(expanded)  # after expansion, so `$SHELL -c SCRIPT` is seen as a shell too
    return [words[i] if i in scripts else word for i, word in enumerate(expanded)]


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "fish"})
_SHELL_LONG_OPTIONS_WITH_VALUE = frozenset({"--rcfile", "--init-file"})


def _expand(word: str, env: Mapping[str, str]) -> str:
    return _VARIABLE.sub(lambda m: env.get(m[1] or m[2], m[0]), word)


def _shell_scripts(words: list[str]) -> set[int]:
    """Indexes of the words a shell reads as script text: after any word naming a shell (`bash`,
    `/bin/sh`, whatever precedes it: `env`, `timeout 60`, `nice`), its options, when one cluster holds
    `c` (`-c`, `-lc`, `-ec`), are followed by the script."""
    found = set()
    for i, word in enumerate(words):
        if os.path.basename(word) in SHELLS and (script := _script_index(words, i + 1)) is not None:
            found.add(script)
    return found


def _script_index(words: list[str], i: int) -> int | None:
    """The index of the first operand after the shell options starting at `i`, when those options hold `-c`."""
    reads_script = False
    while i < len(words):
        word = words[i]
        if word in ("--", "-"):
            i += 1
            break
        if word.startswith("--"):
            i += 2 if word in _SHELL_LONG_OPTIONS_WITH_VALUE else 1
        elif len(word) > 1 and word[0] in "-+":
            reads_script = reads_script or (word[0] == "-" and "c" in word[1:])
            i += 2 if word[-1] in "oO" else 1  # `-o pipefail`, `-O extglob`: the next word is the value
        else:
            break
    return i if reads_script and i < len(words) else None


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

"""The runtime's settings, read from the job environment (see :mod:`trainmaster.jobs.environment`).

When a variable is absent (a script run by hand) a sane default applies: output ``./outputs``,
checkpoints ``<output>/checkpoints``, seed 0, k 25, job id ``local``, no bundle (64 zeros).

``selfcheck``: whether the run ends by replaying its last segment in a fresh process
(:mod:`trainmaster.jobs.selfcheck`). Settings read from the environment — every job — have it on
unless the job's spec says ``checkpoint.selfcheck: false`` (``TRAINMASTER_SELFCHECK=0``) or the
script asks ``RuntimeSettings.from_env(selfcheck=False)``; settings built by hand (tests,
benchmarks, embedding the runtime) have it off unless they say ``selfcheck=True``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import environment

DEFAULT_SEGMENT_STEPS = 25
NO_BUNDLE = "0" * 64
_HEX64 = re.compile(r"[0-9a-f]{64}")


class SettingsError(ValueError):
    """A job environment variable with an unusable value."""


@dataclass(frozen=True)
class RuntimeSettings:
    job_id: str = "local"
    output_dir: Path = Path("outputs")
    checkpoint_dir: Path = Path("outputs/checkpoints")
    resume_from: Path | None = None
    seed: int = 0
    segment_steps: int = DEFAULT_SEGMENT_STEPS
    bundle_sha256: str = NO_BUNDLE
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    selfcheck: bool = False
    keep_every: int = 1
    """m: keep S_0, every m-th state, S_{n-1} and S_n on disk; the others are hashed, then dropped."""
    max_disk_gb: float | None = None
    """The kept states may take at most this many GB (10^9 bytes); None: no budget."""

    @property
    def is_writer(self) -> bool:
        """Rank 0 alone writes checkpoints, metrics and the commitment."""
        return self.rank == 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, selfcheck: bool = True) -> RuntimeSettings:
        env = os.environ if env is None else env
        output = Path(env.get(environment.OUTPUT_DIR) or "outputs")
        bundle = (env.get(environment.BUNDLE_SHA256) or NO_BUNDLE).lower()
        if not _HEX64.fullmatch(bundle):
            raise SettingsError(f"{environment.BUNDLE_SHA256} must be 64 hex digits, got {bundle!r}")
        settings = cls(
            job_id=env.get(environment.JOB_ID) or "local",
            output_dir=output,
            checkpoint_dir=Path(env.get(environment.CHECKPOINT_DIR) or output / "checkpoints"),
            resume_from=Path(env[environment.RESUME_FROM]) if env.get(environment.RESUME_FROM) else None,
            seed=_int(env, environment.SEED, 0),
            segment_steps=_int(env, environment.SEGMENT_STEPS, DEFAULT_SEGMENT_STEPS),
            bundle_sha256=bundle,
            rank=_int(env, "RANK", 0),
            world_size=_int(env, "WORLD_SIZE", 1),
            local_rank=_int(env, "LOCAL_RANK", 0),
            selfcheck=selfcheck and _flag(env, environment.SELFCHECK, True),
            keep_every=_int(env, environment.KEEP_EVERY, 1),
            max_disk_gb=_float(env, environment.MAX_DISK_GB),
        )
        if settings.segment_steps < 1:
            raise SettingsError(f"{environment.SEGMENT_STEPS} must be a positive integer")
        if settings.keep_every < 1:
            raise SettingsError(f"{environment.KEEP_EVERY} must be a positive integer")
        if settings.max_disk_gb is not None and not settings.max_disk_gb > 0:
            raise SettingsError(f"{environment.MAX_DISK_GB} must be a positive number of GB")
        return settings


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = env.get(name)
    if not value:
        return default
    if value not in ("0", "1"):
        raise SettingsError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def _float(env: Mapping[str, str], name: str) -> float | None:
    value = env.get(name)
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {value!r}") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {value!r}") from None

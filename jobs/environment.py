"""The job environment: the only coupling between a backend and the code running inside a job.

Every backend sets these variables before it starts the entrypoint; `jobs.runtime` reads them.
torchrun adds its own `RANK`, `WORLD_SIZE` and `LOCAL_RANK`. Rank 0 alone writes checkpoints
and the commitment.
"""

from __future__ import annotations

from pathlib import Path

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

"""The retention policy: what trainmaster keeps on disk once it is no longer needed, from the user's
`retention.yaml` in the config dir (`paths.config_dir()`; a missing or empty file means the defaults).

```yaml
drop_accepted_segments: true   # after an accepted trusted run: its segments go, but the last and the audited
envs_max_gb: 20                # job environments beyond this (GiB), least recently used first, are removed
```

Applied after every accepted job (`broker/filekeeping/reclaim.py`) and by `trainmaster gc`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.broker import paths
from trainmaster.jobs.yamlfile import FileError, load_model

FILE_NAME = "retention.yaml"
GIB = 2**30


class Retention(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    drop_accepted_segments: bool = Field(
        True, description="Once a trusted run is accepted, drop its segments (and those of the job's earlier "
        "attempts), keeping the last one (the state to continue training from) and those the audit opened.")
    envs_max_gb: float = Field(
        20.0, ge=0, description="Most disk (GiB) the cached job environments may use; the least recently used "
        "beyond it are removed (an environment a running job uses is never removed).")

    @property
    def envs_max_bytes(self) -> int:
        return int(self.envs_max_gb * GIB)


def config_file() -> Path:
    return paths.config_dir() / FILE_NAME


def load_retention() -> Retention:
    """The user's retention policy (the defaults where the file says nothing); FileError when invalid."""
    path = config_file()
    if not path.exists():
        return Retention()
    try:
        return load_model(path, Retention)
    except FileError as exc:
        if exc.problems != [f"{path}:1: the file is empty"]:
            raise
        return Retention()  # every line commented out

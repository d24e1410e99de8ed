"""The user's model-registry settings: `registry.yaml` in the config dir (`paths.config_dir()`). No file, or
no `mlflow:` section, means lineage is recorded but nothing is registered.

```yaml
mlflow:
  tracking_uri: http://127.0.0.1:5000
  models:                 # job name -> registered model name (default: the job's own name)
    agents-nightly: agents
  timeout_s: 10           # each HTTP request to the tracking server
  retries: 1              # MLflow's own retries of a failed request (its default, 7 with backoff, blocks minutes)
```
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.broker import paths
from trainmaster.jobs.yamlfile import FileError, load_model

FILE_NAME = "registry.yaml"
ALIAS = "production"


class MlflowSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tracking_uri: str = Field(min_length=1, description="The MLflow tracking server (http://host:port).")
    models: dict[str, str] = Field(default_factory=dict,
                                   description="Registered model name per job name; a job not listed uses its own name.")
    timeout_s: float = Field(10.0, gt=0, description="Seconds each request to the tracking server may take.")
    retries: int = Field(1, ge=0, le=10, description="Retries of a failed request before the promotion is left pending.")

    def model_name(self, job_name: str) -> str:
        return self.models.get(job_name, job_name)


class RegistryFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mlflow: MlflowSettings | None = None


def config_file() -> Path:
    return paths.config_dir() / FILE_NAME


def load_registry() -> MlflowSettings | None:
    """The MLflow settings, or None when no registry is configured; FileError (file:line) when invalid."""
    path = config_file()
    if not path.exists():
        return None
    try:
        return load_model(path, RegistryFile).mlflow
    except FileError as exc:
        if exc.problems != [f"{path}:1: the file is empty"]:
            raise
        return None  # every line commented out

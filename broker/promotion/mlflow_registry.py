"""The MLflow side of a promotion, through `MlflowClient` (mlflow-skinny): a run per accepted job holding its
metrics and model files, a registered model version tagged with the job's lineage, and the `production` alias.

Every lookup is by the job id tag, so a process that died between a call and its record finds what it made
instead of making it twice. The client is synchronous: the broker calls all this in a worker thread. MLflow
reads its HTTP settings only from the environment: `MLFLOW_HTTP_REQUEST_TIMEOUT` and
`MLFLOW_HTTP_REQUEST_MAX_RETRIES` are set from registry.yaml (its default, seven retries with backoff, would
hold a broker pass for minutes while the registry is down)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from trainmaster.broker.promotion.config import ALIAS, MlflowSettings
from trainmaster.broker.promotion.records import Lineage

TAG = "trainmaster."
JOB_TAG = TAG + "job_id"
LOGGED_TAG = TAG + "logged"
ARTIFACT_PATH = "model"


@dataclass(frozen=True)
class Production:
    version: str
    metrics: dict[str, float]


class RegistryError(RuntimeError):
    """The registry cannot be reached or refused a call: the promotion stays pending and is retried."""


def lineage_tags(lineage: Lineage) -> dict[str, str]:
    """The lineage as MLflow tags (strings), on the run and on the model version."""
    values = {"job_id": lineage.job_id, "attempt_id": lineage.attempt_id, "job_name": lineage.job_name,
              "spec_sha256": lineage.spec_sha256, "bundle_sha256": lineage.bundle_sha256,
              "commitment_root": lineage.commitment_root or "", "verdict": lineage.verdict,
              "verdict_id": "" if lineage.verdict_id is None else str(lineage.verdict_id),
              "cost_micro_usd": str(lineage.cost_micro_usd)}
    return {TAG + k: v for k, v in values.items()}


class MlflowRegistry:
    def __init__(self, settings: MlflowSettings):
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, round(settings.timeout_s)))
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(settings.retries)
        from mlflow import MlflowClient

        self.uri = settings.tracking_uri
        self.client = MlflowClient(tracking_uri=settings.tracking_uri, registry_uri=settings.tracking_uri)

    def call(self, what: str, fn, *args, **kwargs):
        """`fn(*args, **kwargs)`, its failure a RegistryError saying what was being done where."""
        from mlflow.exceptions import MlflowException

        try:
            return fn(*args, **kwargs)
        except (MlflowException, OSError) as exc:
            raise RegistryError(f"MLflow at {self.uri}, {what}: {exc}") from exc

    def logged_run(self, model: str, lineage: Lineage, metrics: dict[str, float], files: list[Path]) -> str:
        """The job's run, with its metrics and model files logged (found by tag, or made now)."""
        experiment = self._experiment(f"trainmaster/{model}")
        runs = self.call("finding the job's run", self.client.search_runs, [experiment],
                         filter_string=f"tags.`{JOB_TAG}` = '{lineage.job_id}'", max_results=1)
        run = runs[0] if runs else self.call("creating a run", self.client.create_run, experiment,
                                             tags=lineage_tags(lineage), run_name=lineage.job_id)
        run_id = run.info.run_id
        if run.data.tags.get(LOGGED_TAG) != "true":
            self._log(run_id, metrics, files)
        return run_id

    def _experiment(self, name: str) -> str:
        found = self.call("finding the experiment", self.client.get_experiment_by_name, name)
        return found.experiment_id if found else self.call("creating the experiment", self.client.create_experiment, name)

    def _log(self, run_id: str, metrics: dict[str, float], files: list[Path]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.call("logging metrics", self.client.log_batch, run_id,
                  metrics=[Metric(k, v, now, 0) for k, v in sorted(metrics.items())])
        for path in files:
            self.call(f"logging {path.name}", self.client.log_artifact, run_id, str(path), ARTIFACT_PATH)
        self.call("marking the run logged", self.client.set_tag, run_id, LOGGED_TAG, "true")
        self.call("finishing the run", self.client.update_run, run_id, status="FINISHED")

    def version_of(self, model: str, lineage: Lineage, run_id: str) -> str:
        """The model version registered for the job (found by tag, or registered now)."""
        found = self.call("finding the job's version", self.client.search_model_versions,
                          f"name = '{model}' and tags.`{JOB_TAG}` = '{lineage.job_id}'")
        if found:
            return str(found[0].version)
        if not self._model_exists(model):
            self.call("creating the registered model", self.client.create_registered_model, model,
                      tags={TAG + "managed": "true"})
        made = self.call("registering the version", self.client.create_model_version, model,
                         source=f"runs:/{run_id}/{ARTIFACT_PATH}", run_id=run_id, tags=lineage_tags(lineage),
                         await_creation_for=0)
        return str(made.version)

    def _model_exists(self, model: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(model)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise RegistryError(f"MLflow at {self.uri}, finding model {model!r}: {exc}") from exc
        except OSError as exc:
            raise RegistryError(f"MLflow at {self.uri}, finding model {model!r}: {exc}") from exc
        return True

    def production(self, model: str) -> Production | None:
        """The version the `production` alias points to and its run's metrics; None before the first."""
        aliases = self.call("reading the aliases", self.client.get_registered_model, model).aliases
        if ALIAS not in aliases:
            return None
        version = self.call("reading the production version", self.client.get_model_version, model, aliases[ALIAS])
        metrics = self.call("reading its metrics", self.client.get_run, version.run_id).data.metrics if version.run_id else {}
        return Production(str(version.version), dict(metrics))

    def set_production(self, model: str, version: str) -> None:
        self.call("moving the production alias", self.client.set_registered_model_alias, model, ALIAS, version)

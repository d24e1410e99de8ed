"""The triggers file, `<config dir>/triggers.yaml`: what the daemon submits on its own, and when.

Each trigger names a job spec and the policy it runs under, and fires on a cron `schedule`, on `data` (N new
files under a local folder or an `s3://`, `gs://`, `az://` prefix, or N new entries of a Redis stream, since the
last accepted run), on either, or only when asked (`manual: true`). A fire is debounced, gated by the policy's
budgets, and never overlaps the trigger's previous run. Errors name the file, line and field.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from trainmaster.broker import paths
from trainmaster.jobs.yamlfile import load_model

FILE_NAME = "triggers.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Data(_Strict):
    """A threshold of new data: files under `folder`, objects under `prefix`, or entries of a Redis `stream`."""

    folder: Path | None = Field(None, description="A local folder; every file under it (recursively) counts once.")
    prefix: str | None = Field(None, description="s3://bucket/prefix, gs://bucket/prefix or az://container/prefix, "
                                                 "listed with the cloud's settings in backends.yaml.")
    redis: str | None = Field(None, description="redis://host:port/db (rediss:// for TLS) of the server holding "
                                                "`stream`.")
    stream: str | None = Field(None, min_length=1, description="The stream's key (with `redis`).")
    min_new: int = Field(ge=1, description="Fire when this many files, objects or entries are new since the last "
                                           "accepted run.")

    @field_validator("prefix")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        from trainmaster.backends.registry import store_schemes

        parsed = urlparse(value or "")
        if value is not None and (f"{parsed.scheme}://" not in store_schemes() or not parsed.netloc):
            raise ValueError("must be s3://bucket/prefix, gs://bucket/prefix or az://container/prefix")
        return value

    @field_validator("redis")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        parsed = urlparse(value or "")
        if value is not None and (parsed.scheme not in ("redis", "rediss") or not parsed.hostname):
            raise ValueError("must be redis://host:port/db or rediss://host:port/db")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Data:
        if sum(x is not None for x in (self.folder, self.prefix, self.redis)) != 1:
            raise ValueError("give exactly one of folder, prefix, or redis (with stream)")
        if (self.redis is None) != (self.stream is None):
            raise ValueError("redis and stream go together")
        return self


class Trigger(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="Unique; shown in jobs and alerts.")
    spec: Path = Field(description="The job.yaml to submit (relative to the triggers file's folder).")
    policy: str = Field("default", description="The policy the job is submitted under (a name or a file).")
    schedule: str | None = Field(None, description="A cron expression (`0 1 * * *`: every day at 01:00).")
    timezone: str = Field("UTC", description="The zone `schedule` is read in (Europe/Paris).")
    data: Data | None = Field(None, description="A data threshold: `folder`, `prefix`, or `redis` + `stream`.")
    debounce_s: float = Field(0, ge=0, description="At least this many seconds between two fires of the trigger.")
    budget_gate: bool = Field(True, description="Do not fire while the policy's budgets would refuse the run.")
    manual: bool = Field(False, description="Fire only when asked (the API); no schedule, no data.")

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        from croniter import croniter

        if value is not None and not croniter.is_valid(value):
            raise ValueError(f"not a cron expression: {value!r} (five fields: minute hour day month weekday)")
        return value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as Europe/Paris)") from None
        return value

    @model_validator(mode="after")
    def _conditions(self) -> Trigger:
        if self.manual and (self.schedule or self.data):
            raise ValueError("a manual trigger has no schedule and no data")
        if not self.manual and not (self.schedule or self.data):
            raise ValueError("give a schedule, data, or both (or manual: true)")
        return self


class TriggersFile(_Strict):
    triggers: list[Trigger] = Field(default_factory=list, description="Each trigger; names are unique.")

    @field_validator("triggers")
    @classmethod
    def _unique(cls, value: list[Trigger]) -> list[Trigger]:
        names = [t.name for t in value]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"trigger names must be unique: {', '.join(twice)}")
        return value


def triggers_file() -> Path:
    return paths.config_dir() / FILE_NAME


def load_triggers(path: Path | None = None) -> list[Trigger]:
    """The triggers of the file (none when it does not exist), with `spec` made absolute; FileError when invalid."""
    path = Path(path) if path is not None else triggers_file()
    if not path.exists():
        return []
    loaded = load_model(path, TriggersFile)
    return [t.model_copy(update={"spec": (path.parent / t.spec).absolute()}) for t in loaded.triggers]


def triggers_schema() -> dict:
    """The JSON Schema of the triggers file, for editors."""
    schema = TriggersFile.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "trainmaster triggers"
    return schema

"""JobSpec: what a training run is, as the user writes it in `job.yaml`.

Every model forbids unknown keys, so a misspelt key is an error with a "did you mean" hint
(see `jobs.yamlfile`) instead of a silently ignored setting. `trainmaster schema job` prints
the JSON Schema generated from these same classes.
"""

from __future__ import annotations

import json
import re
import shlex
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema, field_validator

from trainmaster.jobs.money import format_usd, parse_usd
from trainmaster.jobs.yamlfile import FileError, load_model

Usd = Annotated[
    int,
    Field(ge=0),  # a negative cap or price is a mistake, never a credit
    BeforeValidator(parse_usd),
    PlainSerializer(format_usd, return_type=str),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0}, {"type": "string"}], "description": "US dollars"}),
]
"""An amount users write in dollars; held as integer micro-USD."""

DATA_URI = re.compile(r"^(s3|gs|az)://[^/\s]+(/\S*)?$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PYTHON_NAMES = {"python", "python3"}
RECIPE_TARGET = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):([A-Za-z_][A-Za-z0-9_]*)$")
SHIPPED_RECIPES = "trainmaster.jobs.recipes."
"""A `recipe:` module under this package is one of trainmaster's own; any other is a module of the bundle."""


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)


class Workload(str, Enum):
    development = "development"
    initial_training = "initial_training"
    retraining = "retraining"
    online_learning = "online_learning"


class Precision(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


class DataSource(Model):
    """One input: a local path (relative to the spec file) or an `s3://`, `gs://` or `az://` URI."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="Folder name the data appears under in the job.")
    source: str = Field(description="Local path, or s3://, gs://, az:// URI.")
    sha256: str | None = Field(None, description="Expected sha256 (lowercase hex) of the file or archive.")
    size_bytes: int | None = Field(None, ge=0, description="Its size, when known: the planner prices the egress "
                                                           "of remote data from it.")

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        if "://" in value and not DATA_URI.match(value):
            raise ValueError("URIs must be s3://bucket/key, gs://bucket/key or az://container/blob")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha(cls, value: str | None) -> str | None:
        if value is not None and not SHA256.match(value):
            raise ValueError("must be 64 lowercase hex characters")
        return value

    @property
    def is_remote(self) -> bool:
        return "://" in self.source


class Resources(Model):
    gpus: int = Field(0, ge=0, le=64, description="GPUs per node; 0 runs on CPU.")
    gpu_types: list[str] = Field(default_factory=list, description="Acceptable GPU models (e.g. A100, H100); empty = any.")
    min_vram_gb: int | None = Field(None, ge=1, description="Minimum memory per GPU in GB.")
    cpus: int = Field(1, ge=1, description="CPU cores needed.")
    memory_gb: int | None = Field(None, ge=1, description="Host memory needed in GB.")
    nodes: int = Field(1, ge=1, le=64, description="Machines; more than 1 needs a multi-node backend.")
    processes: int | None = Field(
        None, ge=1, le=256, description="Training processes per node (default: one per GPU, or 1 on CPU)."
    )

    @property
    def nproc(self) -> int:
        return self.processes or max(1, self.gpus)


class Limits(Model):
    max_hours: float | None = Field(None, gt=0, description="Wall-clock limit; the run is cancelled past it.")
    max_usd: Usd | None = Field(None, description="Most this job may cost in all.")
    max_usd_per_hour: Usd | None = Field(None, description="Most an offer may cost per hour.")
    deadline: datetime | None = Field(None, description="When the result is needed (ISO 8601).")
    max_bundle_mb: int = Field(2048, ge=1, description="Refuse to bundle a code directory larger than this.")


class Checkpointing(Model):
    segment_steps: int = Field(25, ge=1, description="k: steps between committed training states.")
    keep_every: int = Field(
        1, ge=1, description="m: every state is hashed into the commitment, but only S_0, every m-th, the last two "
        "are kept on disk; a challenged state not kept is re-made by the executor from the nearest kept one.",
    )
    max_disk_gb: float | None = Field(
        None, gt=0, description="The kept states may take at most this many GB (10^9 bytes); the run stops with "
        "the reason when they would take more.",
    )
    selfcheck: bool = Field(
        True, description="End the run by replaying its last segment in a fresh process and comparing the state "
        "it reaches with the committed one bit for bit, before committing (docs/runtime.md, the self-check): a "
        "state() that misses something fails the run here, not in an audit. It costs a second start-up of the "
        "job's Python and one segment of steps on the job's compute; false skips it (a recipe already checked).",
    )


class Verification(Model):
    replay_audit: Literal["auto", "always", "never"] = Field(
        "auto", description="auto: audit untrusted backends only (as the policy says)."
    )
    challenge_segments: int = Field(8, ge=0, le=256, description="q: random segments re-executed per audit.")
    tier: Literal["sampled", "replay", "refereed"] | None = Field(
        None, description="sampled: the replayed segments plus a few chunks of every boundary, checked against "
        "the optimizer's bounds (≤ 5 % extra compute); replay: the replayed segments alone; refereed: two miners of "
        "different coldkeys run the job and a dispute is settled by bisection and one replayed segment (about 2x "
        "compute). Default: the policy's `verification.tier` for the job's workload class, else sampled.",
    )
    tail_segments: int = Field(
        1, ge=1, le=64, description="L: the last L segments are always replayed (tail-weighted draws); 1 = the last.",
    )
    boundary_chunks: int = Field(
        2, ge=1, le=16, description="c: weights chunks (64 KiB) and second-moment positions drawn per segment in the "
        "sampled tier.",
    )
    evaluator: str | None = Field(None, description="Command in the bundle that evaluates the final checkpoint.")
    thresholds: dict[str, float] = Field(default_factory=dict, description="Metric name -> minimum value.")


class Outputs(Model):
    """Which files of $TRAINMASTER_OUTPUT_DIR are kept (jobs/outputs.py); everything, by default."""

    include: list[str] = Field(
        default_factory=list,
        description="Keep only files matching one of these patterns (.trainmasterignore syntax); empty = every file.",
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="Files matching one of these patterns are not kept, e.g. training_args.bin or 'checkpoint-*/'.",
    )
    max_gb: float | None = Field(None, gt=0, description="The kept outputs may total at most this many GB (10^9 bytes).")
    optional: bool = Field(False, description="Whether a run that writes no outputs may be accepted.")

    @field_validator("include", "exclude")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip() or pattern.lstrip("!").startswith("#"):
                raise ValueError(f"{pattern!r} is not a file pattern")
            if ".." in pattern.split("/"):
                raise ValueError(f"{pattern!r}: patterns match paths inside the outputs folder; '..' never matches")
        return value


class PythonEnv(Model):
    """How the job's Python environment is prepared."""

    python: Literal["current", "requirements"] = Field(
        "current",
        description="current: the broker's own interpreter (local runs); requirements: a virtualenv built from "
        "the requirements file in the bundle.",
    )
    requirements: str = Field("requirements.txt", description="Path inside the code directory.")


class JobSpec(Model):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$", description="Lowercase name; becomes part of the job id.")
    workload: Workload = Field(Workload.development.value,  # the value: a default is not validated, so not converted
                               description="The class the cost policy plans by.")
    entrypoint: str = Field(min_length=1, description="Command run inside the bundle, e.g. `python train.py`.")
    recipe: str | None = Field(
        None,
        description="The job's Recipe, `module:attr`: a module of the bundle's code (e.g. `myrecipe:RECIPE`) or a "
        "shipped one (`trainmaster.jobs.recipes.dqn:RECIPE`). The replay audit re-executes it; its config is the "
        "entrypoint's `--option value` flags (docs/runtime.md).",
    )
    code: str = Field(".", description="Directory bundled with the job, relative to the spec file.")
    project: str | None = Field(None, description="Budget and reporting group.")
    data: list[DataSource] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    limits: Limits = Field(default_factory=Limits)
    estimated_hours: float | None = Field(None, gt=0, description="Expected run time, for cost estimates.")
    checkpoint: Checkpointing = Field(default_factory=Checkpointing)
    seed: int = Field(0, ge=0, lt=2**63)
    precision: Precision = Precision.fp32.value
    verification: Verification = Field(default_factory=Verification)
    outputs: Outputs = Field(default_factory=Outputs, description="Which output files are kept.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables for the job.")
    environment: PythonEnv = Field(default_factory=PythonEnv)
    launcher: Literal["auto", "torchrun", "direct"] = Field(
        "auto",
        description="How local runs start: torchrun, or directly with torchrun's variables set (one process); "
        "auto uses torchrun for more than one process and saves its start-up time otherwise.",
    )

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: str) -> str:
        try:
            argv = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot parse the command: {exc}") from None
        if not argv:
            raise ValueError("the command is empty")
        return value

    @field_validator("recipe")
    @classmethod
    def _recipe(cls, value: str | None) -> str | None:
        if value is None:
            return value
        found = RECIPE_TARGET.match(value)
        if not found:
            raise ValueError("must be `module:attr`, e.g. `myrecipe:RECIPE` (a module of the bundle's code)")
        module = found[1]
        if module.split(".")[0] == "trainmaster" and not (
            module.startswith(SHIPPED_RECIPES) and module.count(".") == SHIPPED_RECIPES.count(".")
        ):
            raise ValueError(f"a trainmaster module must be a shipped recipe, {SHIPPED_RECIPES}<name>")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key.startswith("TRAINMASTER_"):
                raise ValueError(f"{key} is set by trainmaster itself")
        return value

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.entrypoint)

    @property
    def bundle_recipe(self) -> str | None:
        """The module of `recipe:` when it is the job's own code (in the bundle), not a shipped recipe."""
        if self.recipe is None or self.recipe.startswith(SHIPPED_RECIPES):
            return None
        return self.recipe.partition(":")[0]

    def canonical_json(self) -> bytes:
        """The spec as canonical JSON: what the bundle carries and what its hash covers."""
        data = self.model_dump(mode="json")
        return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


class LoadedSpec(BaseModel):
    """A spec together with where it came from: the code directory resolves against the file."""

    model_config = ConfigDict(frozen=True)
    spec: JobSpec
    path: Path
    code_dir: Path


def load_spec(path: Path | str) -> LoadedSpec:
    """Load and check a job file; raises FileError naming file, line and field."""
    path = Path(path).absolute()
    spec = load_model(path, JobSpec)
    code_dir = (path.parent / spec.code).resolve()
    problems = _check_paths(path, spec, code_dir)
    if problems:
        raise FileError(path, problems)
    return LoadedSpec(spec=spec, path=path, code_dir=code_dir)


def _check_paths(path: Path, spec: JobSpec, code_dir: Path) -> list[str]:
    """What the file names must exist: the code dir, the entrypoint's script, local data."""
    problems = []
    if not code_dir.is_dir():
        return [f"{path}: code: directory {code_dir} does not exist"]
    script = entry_script(spec.argv)
    if script is not None and not (code_dir / script).is_file():
        problems.append(f"{path}: entrypoint: {script} not found in the code directory {code_dir}")
    if (module := spec.bundle_recipe) is not None:
        base = code_dir.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            problems.append(f"{path}: recipe: module {module} not found in the code directory {code_dir}")
    if spec.environment.python == "requirements" and not (code_dir / spec.environment.requirements).is_file():
        problems.append(f"{path}: environment.requirements: {spec.environment.requirements} not found in {code_dir}")
    for i, item in enumerate(spec.data):
        if not item.is_remote and not (path.parent / item.source).exists():
            problems.append(f"{path}: data.{i}.source: {item.source} does not exist")
    return problems


def entry_script(argv: list[str]) -> str | None:
    """The file an entrypoint runs from the bundle, when it names one (`python train.py`, `./run.sh`)."""
    if argv[0] in PYTHON_NAMES:
        rest = [a for a in argv[1:]]
        if not rest or rest[0].startswith("-"):
            return None  # `python -m module` or `python -c ...`: nothing to check on disk
        return rest[0]
    if argv[0].startswith("./") or argv[0].endswith((".py", ".sh")):
        return argv[0]
    return None


def job_schema() -> dict:
    """The JSON Schema of job files, for editors."""
    schema = JobSpec.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "trainmaster job"
    return schema


__all__ = ["JobSpec", "LoadedSpec", "FileError", "load_spec", "job_schema", "Workload", "Precision", "entry_script"]

"""The replay audit of a job's own Recipe, run in a child process: user code never enters the broker.

A spec's ``recipe: module:attr`` naming a module of the bundle (``verify/recipe_run.py``,
:class:`~trainmaster.verify.recipe_run.UserRecipeRun`) is audited by
``python -m trainmaster.verify.recipe_audit REQUEST RESULT`` with the job's interpreter, the spec's
``env``, the working directory and import path set to the attempt's extracted bundle. The child

1. hashes that directory as a bundle (``jobs.bundle.bundle_digest`` over the tree and its
   ``.trainmaster/spec.json``) and refuses to import anything unless it equals the commitment's
   ``bundle_sha256`` — the code the run committed to, not whatever is on disk now;
2. imports the recipe, parses the spec's options into its config (``recipe_run.parse_config``) and
   checks the commitment's n against the config's T / k;
3. chooses the verifier's device and calibration for the run's (executor, verifier) pair
   (:mod:`trainmaster.verify.verifier_device`: the executor's kind from the signed commitment, the
   broker's ``TRAINMASTER_AUDIT_DEVICE`` as ``device``), checks that the recipe builds there, runs
   :func:`trainmaster.verify.audit.run_audit` on the executor's openings (a checkpoint
   directory) with that Recipe on that device, and writes the :class:`~trainmaster.verify.evidence.AuditReport`
   as JSON.

Whose fault a failure is (the verification's ``kind``):

| failure | outcome |
|---|---|
| the code directory differs from the committed bundle, or cannot be read | ``cannot_verify`` |
| the recipe cannot be imported from the verified bundle, is not a ``Recipe``, or fails to build from the spec's config | ``cannot_verify`` (the job owner's code), with the traceback's last line |
| the entrypoint's options are not a valid config of the recipe, or its T is not a multiple of k | ``cannot_verify`` |
| the commitment's n is not the config's T / k | ``rejected`` |
| an exception in the recipe while re-executing the executor's states | ``rejected`` (``run_audit`` names the segment) |
| the child dies (a signal, an exit without a result) while re-executing the executor's states | ``rejected`` |
| the child dies before that, runs past its time limit, or leaves an unreadable result | ``cannot_verify`` |
| no calibration and no τ | ``cannot_verify`` (as for shipped recipes) |
| no device here can audit the run (a trusted exact replay of a GPU run without a GPU) | ``cannot_verify`` |

The child records the phase it is in (``bundle``, ``import``, ``spec``, ``executor``) in a file next
to the result, so the parent knows whether the executor's data were being replayed when it died.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from trainmaster.jobs.files import HostileFile, read_regular, read_tail

from .errors import VerificationError
from .evidence import AuditReport

if TYPE_CHECKING:
    from trainmaster.jobs.commitment import Commitment

    from .recipe_run import UserRecipeRun

MODULE = "trainmaster.verify.recipe_audit"
TIMEOUT_S = 6 * 3600.0
EXECUTOR_PHASE = "executor"
_PHASE_FILE = "phase"
MAX_RESULT_BYTES = 64 * 2**20
"""The child's result: one audit report (a few KB per challenged segment). The job's recipe runs in
that child and could leave a FIFO or a huge file in its place, so it is read bounded, never followed."""
TAIL_BYTES = 64 * 1024
"""What is read of the child's log and phase files: their ends, whatever their size."""


class AuditRequest(BaseModel):
    """What the parent tells the child (all from the spec, the stored commitment and the broker's settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    code_dir: str
    target: str
    options: list[str]
    seed: int
    k: int
    commitment: str
    segments: list[int]
    openings: str
    tau: float | None = None
    calibration_dir: str | None = None
    trusted_exact: bool = False
    boundary_chunks: int | None = None
    """The sampled tier's chunks per segment (verify/boundaries.py); None: the replayed segments alone."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """The broker's ``TRAINMASTER_AUDIT_DEVICE``: the child chooses the verifier's device (verify/verifier_device.py)."""


class AuditResult(BaseModel):
    """What the child sends back: a report, or whose fault it is that there is none."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["report", "rejected", "cannot_verify"]
    report: AuditReport | None = None
    reason: str | None = None


def audit_user_recipe(
    run: UserRecipeRun,
    *,
    commitment: Commitment,
    openings_dir: Path,
    segments: Sequence[int],
    code_dir: Path,
    tau: float | None = None,
    calibration_dir: Path | None = None,
    trusted_exact: bool = False,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
    device: str = "auto",
    boundary_chunks: int | None = None,
) -> AuditReport:
    """Audit ``segments`` with the job's own recipe in a child process; raise :class:`VerificationError`
    (``rejected`` or ``cannot_verify``, see the module docstring) when it gives no report."""
    from trainmaster.jobs.environment import interpreter_environment
    from trainmaster.jobs.inherited import inherited as inherited_environment
    from trainmaster.jobs.selfcheck import IMPORT_ONLY

    code_dir = Path(code_dir).resolve()
    request = AuditRequest(
        code_dir=str(code_dir), target=run.target, options=list(run.options), seed=run.seed, k=run.k,
        commitment=commitment.canonical_json().decode("ascii"), segments=sorted(set(segments)),
        openings=str(Path(openings_dir).resolve()), tau=tau,
        calibration_dir=str(calibration_dir) if calibration_dir is not None else None, trusted_exact=trusted_exact,
        device=device, boundary_chunks=boundary_chunks,
    )
    python = python or sys.executable
    inherited = os.environ.get("PYTHONPATH")
    # the replay runs the job's own code: it gets what a job inherits (jobs/inherited.py), never the broker's
    # secrets (its database URL, tokens, credentials)
    child_env = interpreter_environment(python, {
        **inherited_environment(os.environ), **(env or {}), IMPORT_ONLY: "1",
        "PYTHONPATH": os.pathsep.join([str(code_dir), *([inherited] if inherited else [])]),
    })
    with tempfile.TemporaryDirectory(prefix="trainmaster-recipe-audit-") as tmp:
        root = Path(tmp)
        (root / "request.json").write_text(request.model_dump_json())
        with open(root / "log", "wb") as log:
            try:
                done = subprocess.run(
                    [python, "-m", MODULE, str(root / "request.json"), str(root / "result.json")],
                    cwd=code_dir, env=child_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    timeout=timeout_s, check=False,
                )
            except subprocess.TimeoutExpired:
                raise VerificationError(
                    f"the audit of the job's recipe {run.target} did not finish within {timeout_s:.0f} s",
                    kind="cannot_verify",
                ) from None
            except OSError as exc:
                raise VerificationError(f"cannot start {python} to audit the job's recipe: {exc}", kind="cannot_verify") from exc
        return _outcome(root, done.returncode, run.target)


def _outcome(root: Path, code: int, target: str) -> AuditReport:
    try:
        raw = read_regular(root / "result.json", MAX_RESULT_BYTES)
    except FileNotFoundError:
        raw = None
    except HostileFile as exc:  # the job's own recipe code ran in the child
        raise VerificationError(f"the audit process of the job's recipe {target} left a result that is refused: {exc}") from None
    if raw is None:
        phase = _read(root / _PHASE_FILE) or "start"
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        tail = _last_line(_read(root / "log"))
        if phase == EXECUTOR_PHASE and code != 0:
            raise VerificationError(
                f"the job's recipe {target} crashed re-executing the executor's states: the audit process {how}: {tail}"
            )
        raise VerificationError(f"the audit process of the job's recipe {target} {how} ({phase}): {tail}", kind="cannot_verify")
    try:
        result = AuditResult.model_validate_json(raw)
    except ValidationError as exc:
        raise VerificationError(
            f"the audit process of the job's recipe {target} left an unreadable result: {exc.errors()[0]['msg']}",
            kind="cannot_verify",
        ) from exc
    if result.kind == "report" and result.report is not None:
        return result.report
    kind = "rejected" if result.kind == "rejected" else "cannot_verify"
    raise VerificationError(result.reason or f"the audit of the job's recipe {target} gave no reason", kind=kind)


def _read(path: Path) -> str | None:
    try:
        return read_tail(path, TAIL_BYTES)[0].decode(errors="replace")
    except (OSError, HostileFile):
        return None


def _last_line(text: str | None) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1][-500:] if lines else "no output"


# the child


class _Refused(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind, self.reason = kind, reason


def _child(request: AuditRequest, phase: Path) -> AuditResult:
    from trainmaster.jobs.commitment import Commitment
    from trainmaster.jobs.devices import replaying_on

    commitment = Commitment.from_json(request.commitment.encode("ascii"))
    phase.write_text("bundle")
    _check_bundle(Path(request.code_dir), commitment.bundle_sha256)
    phase.write_text("import")
    recipe = _import(request.target)
    phase.write_text("spec")
    config = _config(recipe, request, commitment)
    choice = _choose(recipe, config, request, commitment)
    with replaying_on(choice.device):
        _builds(recipe, config, request)
    phase.write_text(EXECUTOR_PHASE)
    return AuditResult(kind="report", report=_audit(recipe, config, request, commitment, choice))


def _check_bundle(code_dir: Path, expected: str) -> None:
    from trainmaster.jobs.bundle import SPEC_MEMBER, BundleError, bundle_digest

    try:
        digest = bundle_digest(code_dir, (code_dir / SPEC_MEMBER).read_bytes()).sha256
    except (OSError, BundleError) as exc:
        raise _Refused("cannot_verify", f"the job's code directory {code_dir} cannot be hashed as its bundle: {exc}") from exc
    if digest != expected:
        raise _Refused(
            "cannot_verify",
            f"the job's code directory {code_dir} is not the committed bundle (sha256 {digest}, the commitment's "
            f"{expected}): it changed after the run, so its recipe is not imported",
        )


def _import(target: str):
    import importlib

    from trainmaster.jobs.recipe import Recipe

    module, _, attr = target.partition(":")
    try:
        recipe = getattr(importlib.import_module(module), attr)
    except BaseException as exc:  # noqa: BLE001 — the job owner's code at import: whatever it raises
        raise _Refused("cannot_verify", f"the job's recipe {target} cannot be imported from its verified bundle: {_last(exc)}") from exc
    if not isinstance(recipe, Recipe):
        raise _Refused("cannot_verify", f"the job's recipe {target} is a {type(recipe).__name__}, not a Recipe")
    return recipe


def _config(recipe, request: AuditRequest, commitment: Commitment) -> dict:
    from .recipe_run import NotReplayable, parse_config

    try:
        config = parse_config(recipe, request.options)
    except NotReplayable as exc:
        raise _Refused("cannot_verify", exc.reason) from exc
    steps = config["steps"]
    if steps % request.k:
        raise _Refused("cannot_verify", f"the spec's T = {steps} is not a multiple of k = {request.k}")
    if commitment.n != steps // request.k:
        raise _Refused(
            "rejected", f"the commitment has n = {commitment.n} segments; the spec's T / k = {steps} / {request.k} "
            f"is {steps // request.k}",
        )
    return config


def _choose(recipe, config: dict, request: AuditRequest, commitment: Commitment):
    """The verifier's device and calibration for this run's (executor, verifier) pair (verify/verifier_device.py)."""
    from .calibration import UncalibratedError, job_class
    from .verifier_device import choose

    try:
        return choose(
            commitment.device_kind, job_class(recipe.name, config),
            calibration_dir=Path(request.calibration_dir) if request.calibration_dir is not None else None,
            tau=request.tau, exact=request.trusted_exact, wanted=request.device,
        )
    except UncalibratedError as exc:
        raise _Refused("cannot_verify", str(exc)) from exc


def _builds(recipe, config: dict, request: AuditRequest) -> None:
    """The recipe on the spec's own data first, on the verifier's device: a failure here is the job owner's."""
    from trainmaster.jobs.execution import build_trainer, full_state

    try:
        cfg = recipe.config(config)
        full_state(build_trainer(recipe, cfg, request.seed), recipe, cfg, request.seed, 0)
    except BaseException as exc:  # noqa: BLE001
        raise _Refused("cannot_verify", f"the job's recipe {request.target} fails to build from the spec's config: {_last(exc)}") from exc


def _audit(recipe, config: dict, request: AuditRequest, commitment: Commitment, choice) -> AuditReport:
    from .audit import run_audit
    from .calibration import UncalibratedError
    from .openings import LocalOpenings

    try:
        return run_audit(
            commitment=commitment, openings=LocalOpenings(Path(request.openings)), segments=request.segments,
            recipe=recipe, config=config, seed=request.seed, tau=request.tau,
            calibration=None if request.trusted_exact else choice.calibration, trusted_exact=request.trusted_exact,
            device=choice.device, calibration_note=choice.note, boundary_chunks=request.boundary_chunks,
            recipe_target=request.target,
        )
    except UncalibratedError as exc:
        raise _Refused("cannot_verify", str(exc)) from exc
    except Exception as exc:  # noqa: BLE001 — run_audit turns the executor's data into rejections itself
        raise _Refused("cannot_verify", f"the audit could not run: {_last(exc)}") from exc


def _last(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(f"usage: python -m {MODULE} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request_path, result_path = Path(args[0]), Path(args[1])
    request = AuditRequest.model_validate_json(request_path.read_bytes())
    sys.path.insert(0, request.code_dir)
    try:
        result = _child(request, request_path.with_name(_PHASE_FILE))
    except _Refused as exc:
        result = AuditResult(kind=exc.kind, reason=exc.reason)
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

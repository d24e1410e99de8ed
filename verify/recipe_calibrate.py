"""Calibrating a job's own Recipe in a child process, as isolated as its audit (``verify/recipe_audit.py``).

``trainmaster verify calibrate JOB.yaml`` for a spec whose ``recipe: module:attr`` names a module of
the bundle never imports that module in its own process. It bundles the spec's code as ``submit``
would, extracts it afresh, and runs ``python -m trainmaster.verify.recipe_calibrate REQUEST RESULT``
with the job's interpreter, the spec's ``env``, the working directory and import path set to that
extracted code, and ``TRAINMASTER_IMPORT_ONLY`` set (a script that trains at import is refused). The
child imports the recipe, parses the entrypoint's options into its config as the audit does
(``recipe_run.parse_config``), measures the calibration (:func:`trainmaster.verify.calibrate.calibrate`,
for the asked device pair) and writes it as JSON; its progress lines go to the parent's stderr.
The parent validates the result (a :class:`~trainmaster.verify.calibration.Calibration` of the job
class the spec's recipe and config make) before it is stored.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from trainmaster.jobs.files import HostileFile, read_regular

from .calibration import Calibration

if TYPE_CHECKING:
    from .recipe_run import UserRecipeRun

MODULE = "trainmaster.verify.recipe_calibrate"
TIMEOUT_S = 24 * 3600.0
MAX_RESULT_BYTES = 64 * 2**20


class CalibrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    code_dir: str
    target: str
    options: list[str]
    seeds: list[int]
    ks: list[int] | None = None
    """None: 10, 25, 50, 100 and the spec's k, those that fit the run (as for a shipped recipe)."""
    k: int
    bases: int
    warmup: int
    executor: Literal["cpu", "cuda"] = "cpu"
    verifier: Literal["cpu", "cuda"] = "cpu"


class CalibrateResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    calibration: Calibration | None = None
    error: str | None = None


class RecipeCalibrationError(ValueError):
    """The job's recipe could not be calibrated (the reason names why: its import, its config, its run)."""


def calibrate_user_recipe(
    run: UserRecipeRun,
    code_dir: Path,
    *,
    seeds: Sequence[int],
    ks: Sequence[int] | None,
    bases: int,
    warmup: int,
    executor: str = "cpu",
    verifier: str = "cpu",
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> Calibration:
    """Measure the job's own recipe's calibration in a child process (see the module docstring); its output
    lines go to ``progress`` (the last ones also end an error's reason)."""
    from trainmaster.jobs.environment import interpreter_environment
    from trainmaster.jobs.selfcheck import IMPORT_ONLY

    code_dir = Path(code_dir).resolve()
    request = CalibrateRequest(
        code_dir=str(code_dir), target=run.target, options=list(run.options), seeds=list(seeds),
        ks=list(ks) if ks else None, k=run.k, bases=bases, warmup=warmup, executor=executor, verifier=verifier,
    )
    python = python or sys.executable
    inherited = os.environ.get("PYTHONPATH")
    child_env = interpreter_environment(python, {
        **os.environ, **(env or {}), IMPORT_ONLY: "1",
        "PYTHONPATH": os.pathsep.join([str(code_dir), *([inherited] if inherited else [])]),
    })
    with tempfile.TemporaryDirectory(prefix="trainmaster-recipe-calibrate-") as tmp:
        root = Path(tmp)
        (root / "request.json").write_text(request.model_dump_json())
        try:
            returncode = _relayed([python, "-m", MODULE, str(root / "request.json"), str(root / "result.json")],
                                  cwd=code_dir, env=child_env, timeout_s=timeout_s, progress=progress)
        except subprocess.TimeoutExpired:
            raise RecipeCalibrationError(f"the calibration of {run.target} did not finish within {timeout_s:.0f} s") from None
        except OSError as exc:
            raise RecipeCalibrationError(f"cannot start {python} to calibrate the job's recipe: {exc}") from exc
        try:
            result = CalibrateResult.model_validate_json(read_regular(root / "result.json", MAX_RESULT_BYTES))
        except FileNotFoundError:
            how = f"was killed by signal {-returncode}" if returncode < 0 else f"exited with code {returncode}"
            raise RecipeCalibrationError(f"the calibration process of {run.target} {how} without a result") from None
        except (HostileFile, ValidationError, OSError) as exc:
            raise RecipeCalibrationError(f"the calibration process of {run.target} left an unreadable result: {exc}") from None
    if result.error or result.calibration is None:
        raise RecipeCalibrationError(result.error or f"the calibration of {run.target} gave no result")
    return result.calibration


def _relayed(argv: list[str], *, cwd: Path, env: Mapping[str, str], timeout_s: float,
             progress: Callable[[str], None] | None) -> int:
    """Run the child, handing each line it prints to ``progress``; its exit code."""
    import threading

    process = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT)

    def relay() -> None:
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            if progress is not None and line:
                progress(line[-500:])

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    reader.join(5)
    return code


# the child


def _child(request: CalibrateRequest) -> CalibrateResult:
    from .calibrate import calibrate, default_ks
    from .recipe_audit import _import, _Refused
    from .recipe_run import NotReplayable, parse_config

    try:
        recipe = _import(request.target)
    except _Refused as exc:
        return CalibrateResult(error=exc.reason)
    try:
        config = parse_config(recipe, request.options)
    except NotReplayable as exc:
        return CalibrateResult(error=exc.reason)
    steps = config["steps"]
    ks = request.ks or default_ks(request.k, steps)
    try:
        calibration = calibrate(
            recipe, config, ks=ks, seeds=request.seeds, bases=request.bases, warmup=request.warmup,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
            executor=request.executor, verifier=request.verifier,
        )
    except Exception as exc:  # noqa: BLE001 — the job owner's recipe, or a run that cannot be calibrated as asked
        return CalibrateResult(error=f"cannot calibrate {request.target}: {traceback.format_exception_only(type(exc), exc)[-1].strip()}")
    return CalibrateResult(calibration=calibration)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(f"usage: python -m {MODULE} REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    request = CalibrateRequest.model_validate_json(Path(args[0]).read_bytes())
    sys.path.insert(0, request.code_dir)
    result = _child(request)
    out = Path(args[1])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(result.model_dump_json())
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

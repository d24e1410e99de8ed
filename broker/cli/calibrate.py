"""`trainmaster verify calibrate JOB.yaml`: measure a job class's honest and cheating r, store τ(k).

Writes ``<dir>/<job class>.json`` (default ``$TRAINMASTER_HOME/calibration``; ``<job class>.<e>-<v>.json``
for another device pair than cpu→cpu, ``--executor``/``--verifier``), the file every audit of the
class and pair reads. A job's own recipe (``recipe: module:attr`` of the bundle) is calibrated in a
child process, isolated as its audit is (``verify/recipe_calibrate.py``). Exit codes: 0 calibrated; 1 calibrated, but the spec's k separates honest
executors from the mildest cheat by less than R = 10 (use the suggested k); 2 usage or environment
error (unreadable spec, not a recipe job, a k that does not fit the run). Module-level imports stay
at typer alone, so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

def register(verify_app: typer.Typer) -> None:
    """Add `calibrate` to the `verify` group."""
    verify_app.command("calibrate")(calibrate)


def calibrate(
    job: Path = typer.Argument(..., metavar="JOB.yaml", help="Job spec whose entrypoint runs a recipe."),
    ks: list[int] = typer.Option(
        None, "--k", metavar="K", help="Segment length to calibrate (repeatable). Default: 10 25 50 100 and the spec's k."
    ),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Runs to take base states from (the spec's seed and the next ones)."),
    bases: int = typer.Option(
        4, "--bases", min=1, help="Base states per run: where learning starts, the rest spread up to the run's end."
    ),
    warmup: int = typer.Option(0, "--warmup", min=0, help="No base state before this step."),
    out: Path = typer.Option(None, "--out", help="Calibration directory (default $TRAINMASTER_HOME/calibration)."),
    executor: str = typer.Option(
        "cpu", "--executor", metavar="cpu|cuda", help="The device kind the executors train on (their variants run there)."
    ),
    verifier: str = typer.Option(
        "cpu", "--verifier", metavar="cpu|cuda", help="The device kind the audit re-executes on."
    ),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Measure r for honest-but-different executors (threads, one-ulp nudge, float64; on a GPU executor its plain
    run, one-ulp nudge and float64) and for the mildest cheat (lr × 0.9) at each k; store
    τ(k) = sqrt(p99 honest · min cheat) and R(k) = min cheat / p99 honest for the (executor, verifier) pair."""
    from trainmaster.jobs.spec import load_spec
    from trainmaster.jobs.yamlfile import FileError
    from trainmaster.verify.calibration import default_calibration_dir, store_calibration
    from trainmaster.verify.recipe_run import NotReplayable, user_recipe

    for name, kind in (("--executor", executor), ("--verifier", verifier)):
        if kind not in ("cpu", "cuda"):
            _fail(f"{name} must be cpu or cuda, not {kind!r}")
    if "cuda" in (executor, verifier):
        from trainmaster.jobs.devices import cuda_available

        if not cuda_available():
            _fail(f"calibrating {executor}→{verifier} needs a CUDA device, and this process sees none")
    try:
        loaded = load_spec(job)
        own = user_recipe(loaded)
    except (FileError, NotReplayable) as exc:
        _fail(str(exc))
    progress = None if as_json else (lambda line: typer.echo(line, err=True))
    options = dict(seeds=seeds, ks=sorted(set(ks)) if ks else None, bases=bases, warmup=warmup,
                   executor=executor, verifier=verifier, progress=progress)
    if own is not None:
        calibration, spec_k = _own_recipe(loaded, own, **options), own.k
    else:
        calibration, spec_k = _shipped_recipe(loaded, **options)
    path = store_calibration(calibration, out or default_calibration_dir())
    run_k = spec_k
    spec_point = next((p for p in calibration.points if p.k == run_k), None)
    if as_json:
        payload = {
            "path": str(path), "spec_k": run_k, "recommended_k": calibration.recommended_k,
            "warnings": calibration.warnings(), "calibration": calibration.model_dump(mode="json"),
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print(calibration, path, run_k)
    if spec_point is not None and spec_point.separation < 10:
        raise typer.Exit(1)


def _shipped_recipe(loaded, *, seeds, ks, bases, warmup, executor, verifier, progress):
    """Measured here: the recipe is trainmaster's own."""
    from trainmaster.verify.calibrate import CalibrationError, default_ks
    from trainmaster.verify.calibrate import calibrate as measure
    from trainmaster.verify.recipe_run import NotReplayable, recipe_run

    try:
        run = recipe_run(loaded)
    except NotReplayable as exc:
        _fail(str(exc))
    chosen = ks or default_ks(run.k, run.recipe.config(run.config).steps)
    try:
        calibration = measure(
            run.recipe, run.config, ks=chosen, seeds=[run.seed + j for j in range(seeds)], bases=bases, warmup=warmup,
            progress=progress, executor=executor, verifier=verifier,
        )
    except (CalibrationError, ValueError) as exc:
        _fail(f"cannot calibrate {loaded.path}: {exc}")
    return calibration, run.k


def _own_recipe(loaded, own, *, seeds, ks, bases, warmup, executor, verifier, progress):
    """Measured in a child process importing the job's code, bundled and extracted afresh as `submit` sends it."""
    import tempfile

    from trainmaster.broker import paths
    from trainmaster.broker.cli.fresh_code import fresh_code
    from trainmaster.jobs.bundle import BundleError
    from trainmaster.verify.recipe_calibrate import RecipeCalibrationError, calibrate_user_recipe

    with tempfile.TemporaryDirectory(prefix="trainmaster-calibrate-") as scratch:
        try:
            code = fresh_code(loaded, Path(scratch))
        except BundleError as exc:
            _fail(f"{loaded.path}: code: {exc}")
        python = _interpreter(loaded, code, paths.envs_dir())
        try:
            return calibrate_user_recipe(
                own, code, seeds=[own.seed + j for j in range(seeds)], ks=ks, bases=bases, warmup=warmup,
                executor=executor, verifier=verifier, python=python, env=loaded.spec.env,
                progress=progress or (lambda line: None),
            )
        except RecipeCalibrationError as exc:
            _fail(f"cannot calibrate {loaded.path}: {exc}")


def _interpreter(loaded, code: Path, envs_dir: Path) -> str | None:
    """The job's virtualenv when its spec asks for one and the broker built it, else this interpreter."""
    if loaded.spec.environment.python != "requirements":
        return None
    from trainmaster.jobs.venvs import built_python

    return built_python(envs_dir, code / loaded.spec.environment.requirements)


def _print(calibration, path: Path, spec_k: int) -> None:
    bases = ", ".join(f"seed {b.seed} at step {b.step}" for b in calibration.bases)
    typer.echo(f"job class {calibration.job_class} ({calibration.recipe}), {calibration.pair}; bases: {bases}")
    typer.echo(f"{'k':>5}  {'honest p99 r':>12}  {'min cheat r':>11}  {'R':>8}  {'tau':>9}")
    for p in calibration.points:
        mark = "  <- spec" if p.k == spec_k else ""
        typer.echo(f"{p.k:>5}  {p.honest_p99:>12.3g}  {p.cheat_min:>11.3g}  {p.separation:>8.3g}  {p.tau:>9.3g}{mark}")
    best = calibration.recommended_k
    typer.echo(f"recommended k: {best} (the largest with R >= 10)" if best else "no calibrated k reaches R >= 10")
    for line in calibration.warnings():
        typer.echo(f"warning: {line}", err=True)
    typer.echo(f"stored {path}")


def _fail(message: str) -> None:
    from trainmaster.broker.cli.safe_text import visible

    typer.echo(f"error: {visible(message)}", err=True)
    raise typer.Exit(2)

"""`trainmaster verify calibrate JOB.yaml`: measure a job class's honest and cheating r, store τ(k).

Writes ``<dir>/<job class>.json`` (default ``$TRAINMASTER_HOME/calibration``), the file every audit
of the class reads. Exit codes: 0 calibrated; 1 calibrated, but the spec's k separates honest
executors from the mildest cheat by less than R = 10 (use the suggested k); 2 usage or environment
error (unreadable spec, not a recipe job, a k that does not fit the run). Module-level imports stay
at typer alone, so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

DEFAULT_KS = (10, 25, 50, 100)


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
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Measure r for honest-but-different executors (threads, one-ulp nudge, float64) and for the mildest
    cheat (lr × 0.9) at each k; store τ(k) = sqrt(p99 honest · min cheat) and R(k) = min cheat / p99 honest."""
    from trainmaster.jobs.spec import load_spec
    from trainmaster.jobs.yamlfile import FileError
    from trainmaster.verify.calibrate import CalibrationError
    from trainmaster.verify.calibrate import calibrate as measure
    from trainmaster.verify.calibration import default_calibration_dir, store_calibration
    from trainmaster.verify.recipe_run import NotReplayable, recipe_run

    try:
        run = recipe_run(load_spec(job))
    except (FileError, NotReplayable) as exc:
        _fail(str(exc))
    chosen = sorted(set(ks)) if ks else _default_ks(run.k, run.recipe.config(run.config).steps)
    progress = None if as_json else (lambda line: typer.echo(line, err=True))
    try:
        seeds_used = [run.seed + j for j in range(seeds)]
        calibration = measure(
            run.recipe, run.config, ks=chosen, seeds=seeds_used, bases=bases, warmup=warmup, progress=progress
        )
    except (CalibrationError, ValueError) as exc:
        _fail(f"cannot calibrate {job}: {exc}")
    path = store_calibration(calibration, out or default_calibration_dir())
    spec_point = next((p for p in calibration.points if p.k == run.k), None)
    if as_json:
        payload = {
            "path": str(path), "spec_k": run.k, "recommended_k": calibration.recommended_k,
            "warnings": calibration.warnings(), "calibration": calibration.model_dump(mode="json"),
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        _print(calibration, path, run.k)
    if spec_point is not None and spec_point.separation < 10:
        raise typer.Exit(1)


def _default_ks(spec_k: int, steps: int) -> list[int]:
    """10, 25, 50, 100 and the spec's k, those that leave at least half the run to spread base states over."""
    return sorted(k for k in {*DEFAULT_KS, spec_k} if k <= steps // 2)


def _print(calibration, path: Path, spec_k: int) -> None:
    bases = ", ".join(f"seed {b.seed} at step {b.step}" for b in calibration.bases)
    typer.echo(f"job class {calibration.job_class} ({calibration.recipe}); bases: {bases}")
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

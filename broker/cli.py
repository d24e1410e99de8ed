"""The `trainmaster` command line (Typer + Rich).

Exit codes: 0 success; 1 the thing asked about is bad (invalid spec, job failed, no backend can
run it); 2 usage or environment error (missing file, disk full, unreachable backend).
Module-level imports stay light (typer only) so `trainmaster --help` is fast; everything else
is imported inside the command that needs it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    name="trainmaster",
    help="Run each training job on the cheapest compute that meets its constraints, and verify what comes back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: Rich's help renderer alone costs ~0.15 s of start-up
)

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output.")


class Exit:
    OK, BAD, USAGE = 0, 1, 2


def _console():
    from rich.console import Console

    return Console()


def _err(message: str, code: int) -> None:
    from rich.console import Console

    Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _broker():
    from trainmaster.broker.service import Broker

    return Broker()


def _run_guarded(fn):
    """Map our exceptions to messages and exit codes, once, for every command."""
    from trainmaster.backends.base import BackendError
    from trainmaster.broker.planner import PlanError
    from trainmaster.broker.store import NotFound
    from trainmaster.jobs.bundle import BundleError
    from trainmaster.jobs.yamlfile import FileError

    try:
        return fn()
    except FileError as exc:
        missing = all(p.endswith(": no such file") or "no policy named" in p for p in exc.problems)
        _err(str(exc), Exit.USAGE if missing else Exit.BAD)
    except PlanError as exc:
        _err(str(exc), Exit.BAD)
    except BundleError as exc:
        _err(f"cannot bundle the code: {exc}", Exit.BAD)
    except NotFound as exc:
        _err(str(exc.args[0]), Exit.USAGE)
    except (BackendError, OSError) as exc:
        _err(str(exc), Exit.USAGE)


@app.command()
def submit(
    spec: Path = typer.Argument(..., help="The job file (job.yaml)."),
    policy: str = typer.Option("default", "--policy", "-p", help="Policy name or file."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the job to finish, streaming its logs."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check, bundle and plan, then print the plan; submit nothing."),
    as_json: bool = JSON_OPT,
) -> None:
    """Submit a job: check the spec, pick an offer by the policy, and start it."""
    from trainmaster.broker import render

    if not spec.is_file():
        _err(f"{spec}: no such file", Exit.USAGE)
    broker = _broker()
    if dry_run:
        prepared = _run_guarded(lambda: broker.prepare(spec, policy))
        if as_json:
            print(json.dumps(render.prepared_json(prepared), indent=2))
        else:
            render.print_prepared(_console(), prepared)
        return
    job = _run_guarded(lambda: broker.submit(spec, policy))
    if job.state == "failed" and not as_json:
        _err(f"{job.id} failed before it started: {job.reason}", Exit.BAD)
    if not wait:
        if as_json:
            print(json.dumps(render.job_json(broker, job), indent=2))
        else:
            _console().print(f"submitted [bold]{job.id}[/bold] ({job.state}); follow it with "
                             f"`trainmaster logs -f {job.id}`", highlight=False)
        return
    if not as_json:
        _console().print(f"submitted [bold]{job.id}[/bold]; streaming its logs", highlight=False)
        for line in _run_guarded(lambda: broker.logs(job.id, follow=True)):
            sys.stdout.write(line)
            sys.stdout.flush()
    job = _run_guarded(lambda: broker.wait(job.id))
    if as_json:
        print(json.dumps(render.job_json(broker, job), indent=2))
    else:
        render.print_job(_console(), broker, job)
    raise typer.Exit(Exit.OK if job.state == "accepted" else Exit.BAD)


@app.command()
def status(job_id: str = typer.Argument(..., help="Job id or a unique prefix."), as_json: bool = JSON_OPT) -> None:
    """Show a job: its state, attempts, cost and where its outputs are."""
    from trainmaster.broker import render

    broker = _broker()
    job = _run_guarded(lambda: broker.store.find_job(job_id))
    job = _run_guarded(lambda: broker.advance(job.id))
    if as_json:
        print(json.dumps(render.job_json(broker, job, events=True), indent=2))
    else:
        render.print_job(_console(), broker, job, events=True)
    raise typer.Exit(Exit.BAD if job.state in ("failed", "cancelled") else Exit.OK)


@app.command("ls")
def list_jobs(
    all_: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    limit: int = typer.Option(50, help="At most this many jobs."),
    as_json: bool = JSON_OPT,
) -> None:
    """List jobs, newest first (unfinished ones unless --all)."""
    from trainmaster.broker import render, states

    broker = _broker()
    _run_guarded(broker.refresh)
    wanted = None if all_ else set(states.JOB_TRANSITIONS) - states.JOB_ENDS
    jobs = broker.store.jobs(states_in=wanted, limit=limit)
    if as_json:
        print(json.dumps([render.job_json(broker, j) for j in jobs], indent=2))
    else:
        render.print_jobs(_console(), broker, jobs)


@app.command()
def logs(
    job_id: str = typer.Argument(..., help="Job id or a unique prefix."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
) -> None:
    """Print a job's log (its latest attempt)."""
    broker = _broker()
    for line in _run_guarded(lambda: broker.logs(job_id, follow=follow)):
        sys.stdout.write(line)
        sys.stdout.flush()
    if follow:
        _run_guarded(lambda: broker.advance(broker.store.find_job(job_id).id))


@app.command()
def cancel(job_id: str = typer.Argument(..., help="Job id or a unique prefix."), as_json: bool = JSON_OPT) -> None:
    """Cancel a job: stop its processes (the whole process group) and record the cost so far."""
    from trainmaster.broker import render

    broker = _broker()
    job = _run_guarded(lambda: broker.cancel(job_id))
    if as_json:
        print(json.dumps(render.job_json(broker, job), indent=2))
    else:
        _console().print(f"{job.id}: {job.state}", highlight=False)


@app.command()
def schema(kind: str = typer.Argument("job", help="job or policy")) -> None:
    """Print the JSON Schema of a user file, for editors."""
    if kind == "job":
        from trainmaster.jobs.spec import job_schema

        print(json.dumps(job_schema(), indent=2))
    elif kind == "policy":
        from trainmaster.broker.policy import Policy

        print(json.dumps(Policy.model_json_schema(), indent=2))
    else:
        _err(f"unknown schema {kind!r}; choose job or policy", Exit.USAGE)


def _register_groups() -> None:
    """Commands kept in their own modules (each imports only typer at module level)."""
    from trainmaster.broker import cli_cost, cli_verify

    cli_cost.register(app)
    cli_verify.register(app)


_register_groups()


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""Job commands: `submit`, `status`, `ls`, `logs`, `cancel` and `schema`, added to the app by `register`.

Every Broker call they make is in `calls`, one function per command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from trainmaster.broker.cli import calls
from trainmaster.broker.cli.exits import BAD, OK, USAGE, console, escape, fail, guarded

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output.")
RECENT_S = 24 * 3600
"""`ls` without --all lists the jobs that ended within this many seconds beside the unfinished ones."""


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.command()(status)
    app.command("ls")(list_jobs)
    app.command()(logs)
    app.command()(cancel)
    app.command()(resume)
    app.command()(schema)


def _write(line: str) -> None:
    sys.stdout.write(line)
    sys.stdout.flush()


def _streamed(as_json: bool):
    """(on_log, shown) for a followed log: nowhere with --json; on a terminal, line by line above a live
    status line (broker/cli/live.py); otherwise written as it comes, with no status line."""
    if as_json:
        return None, None
    from trainmaster.broker.cli import live

    line = live.for_terminal()
    return (_write, None) if line is None else (line.write, line.shown)


def submit(
    spec: Path = typer.Argument(..., help="The job file (job.yaml), or a directory holding one."),
    policy: str = typer.Option("default", "--policy", "-p", help="Policy name or file."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the job to finish, streaming its logs."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Check, bundle and plan, then print the plan; submit nothing."),
    as_json: bool = JSON_OPT,
    wide: bool = typer.Option(False, "--wide", help="With --dry-run: every column of the plan whole."),
) -> None:
    """Submit a job: check the spec, pick an offer by the policy, and start it."""
    from trainmaster.broker import job_view
    from trainmaster.broker.cli import render

    spec = _job_file(spec)
    if dry_run:
        prepared = guarded(lambda: calls.dry_run(spec, policy))
        if as_json:
            print(json.dumps(render.prepared_json(prepared), indent=2))
        else:
            render.print_prepared(console(), prepared, wide=wide)
        raise typer.Exit(BAD if prepared.budget else OK)

    started: list = []

    def submitted(job, left_out: list[str]) -> None:
        started.append(job)
        from trainmaster.broker.stages.submission import left_out_warning

        for warning in left_out_warning(left_out):
            console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
        if job.state == "failed" and not as_json:
            fail(f"{job.id} failed before it started: {job.reason}", BAD)
        if not as_json:
            follow = "streaming its logs" if wait else f"follow it with `trainmaster logs -f {job.id}`"
            console().print(f"submitted [bold]{escape(job.id)}[/bold] ({job.state}); {escape(follow)}", highlight=False)

    on_log, shown = _streamed(as_json)
    try:
        broker, job = guarded(lambda: calls.submit(spec, policy, wait=wait, on_submitted=submitted,
                                                   on_log=on_log, shown=shown))
    except KeyboardInterrupt:
        _interrupted(started[0].id if started else None)
    if as_json:
        print(json.dumps(job_view.job_json(broker.store, job), indent=2))
    elif wait:
        render.print_job(console(), broker, job)
    if wait:
        raise typer.Exit(wait_exit(job.state))


def _job_file(spec: Path) -> Path:
    """The job file `submit` was given: a directory stands for the `job.yaml` in it."""
    if spec.is_dir():
        if not (spec / "job.yaml").is_file():
            fail(f"{spec} is a directory with no job.yaml in it; give the job file's path", USAGE)
        return spec / "job.yaml"
    if not spec.is_file():
        fail(f"{spec}: no such file", USAGE)
    return spec


def wait_exit(state: str) -> int:
    """The exit code of a command that waited for a job: 0 accepted, 2 waiting to be verified again, 1 otherwise."""
    return OK if state == "accepted" else USAGE if state == "unverified" else BAD


def _interrupted(job_id: str | None) -> None:
    """Ctrl-C while waiting stops the waiting, not the job."""
    if job_id is None:
        fail("interrupted before the job was recorded; nothing was submitted", 130)
    job_id = escape(job_id)
    console(stderr=True).print(
        f"\ninterrupted: {job_id} keeps running. Follow it with `trainmaster logs -f {job_id}`, "
        f"or stop it with `trainmaster cancel {job_id}`.", highlight=False, soft_wrap=True)
    raise typer.Exit(130)


def status(job_id: str = typer.Argument(..., help="Job id or a unique prefix."), as_json: bool = JSON_OPT) -> None:
    """Show a job: its state, attempts, cost and where its outputs are."""
    from trainmaster.broker import job_view
    from trainmaster.broker.cli import render

    notes: list[str] = []
    broker, job = guarded(lambda: calls.status(job_id, on_note=notes.append))
    if as_json:
        print(json.dumps(job_view.job_json(broker.store, job, events=True), indent=2))
    else:
        render.print_job(console(), broker, job, events=True)
    for note in notes:  # it could not be read as usual, or it waits on our side (a full disk): what to fix
        console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)
    raise typer.Exit(USAGE if notes else BAD if job.state in ("failed", "cancelled") else OK)


def list_jobs(
    all_: bool = typer.Option(False, "--all", "-a", help="Include finished jobs."),
    limit: int = typer.Option(50, min=0, help="At most this many jobs (0: all of them)."),
    as_json: bool = JSON_OPT,
    wide: bool = typer.Option(False, "--wide", help="Every column whole, however wide the lines."),
) -> None:
    """List jobs, newest first: unfinished ones and those that ended in the last 24 hours (every job with --all)."""
    import time

    from trainmaster.broker import job_view
    from trainmaster.broker.cli import render

    notes: list[str] = []
    since = None if all_ else time.time() - RECENT_S
    broker, jobs = guarded(lambda: calls.list_jobs(None, limit or -1, on_note=notes.append,  # -1: no limit
                                                   ended_since=since))
    if as_json:
        print(json.dumps([job_view.job_json(broker.store, j) for j in jobs], indent=2))
    else:
        render.print_jobs(console(), broker, jobs, recent_only=not all_, wide=wide)
    for note in notes:
        console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)
    if notes:
        raise typer.Exit(USAGE)


def logs(
    job_id: str = typer.Argument(..., help="Job id or a unique prefix."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing until the job ends."),
) -> None:
    """Print a job's log (its latest attempt).

    Followed on a terminal, a live status line under it shows the state, step/T, steps/s, elapsed time,
    cost so far and ETA."""
    on_log, shown = _streamed(False) if follow else (_write, None)
    try:
        guarded(lambda: calls.logs(job_id, follow=follow, on_log=on_log, shown=shown))
    except KeyboardInterrupt:
        _interrupted(job_id)


def cancel(job_id: str = typer.Argument(..., help="Job id or a unique prefix."), as_json: bool = JSON_OPT) -> None:
    """Cancel a job: stop its processes (the whole process group) and record the cost so far. On a job that
    already ended, stop whatever of its attempts still runs, and say so."""
    import time

    from trainmaster.broker import job_view

    since = time.time()
    broker, job = guarded(lambda: calls.cancel(job_id))
    now = [e for e in broker.store.events(job.id) if e.at >= since]
    stopped = [e.detail["message"] for e in now if e.kind == "stopped"]
    ended_before = not any(e.kind == "cancel_requested" for e in now)
    nothing = (f"nothing was stopped: the job had already ended ({job.state}) and none of its processes was running"
               if ended_before and not stopped else None)
    if as_json:
        print(json.dumps({**job_view.job_json(broker.store, job), "stopped": stopped, "already_ended": ended_before},
                         indent=2))
    else:
        console().print(f"{escape(job.id)}: {job.state}", highlight=False)
        for message in stopped if stopped else [nothing] if nothing else []:
            console().print(f"  {escape(message)}", highlight=False)


def resume(
    job_id: str = typer.Argument(..., help="Job id or a unique prefix."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the job to finish, streaming its logs."),
    max_hours: float = typer.Option(None, "--max-hours", help="Raise the job's wall-clock limit (hours) first."),
    max_usd: str = typer.Option(None, "--max-usd", help="Raise the job's cost limit (dollars) first."),
    as_json: bool = JSON_OPT,
) -> None:
    """Start a failed or cancelled job again on its planned offer, from the last committed segment (a job
    that does not train with trainmaster's runtime restarts from scratch, and is told so).
    Exit 0 when started (with --wait: when accepted), 1 when it fails again."""
    from trainmaster.broker import job_view
    from trainmaster.broker.cli import render

    points: list = []

    def resumed(job, point) -> None:
        points.append(point)
        if not as_json:
            follow = "streaming its logs" if wait else f"follow it with `trainmaster logs -f {job.id}`"
            console().print(f"resumed [bold]{escape(job.id)}[/bold] ({job.state}); {escape(point.sentence())}; "
                            f"{escape(follow)}",
                            highlight=False, soft_wrap=True)

    on_log, shown = _streamed(as_json)
    broker, job = guarded(lambda: calls.resume(job_id, wait=wait, max_hours=max_hours, max_usd=max_usd,
                                               on_resumed=resumed, on_log=on_log, shown=shown))
    if as_json:
        print(json.dumps({**job_view.job_json(broker.store, job), "resumes_from": points[0].to_json()}, indent=2))
    elif wait:
        render.print_job(console(), broker, job)
    raise typer.Exit(wait_exit(job.state) if wait else BAD if job.state in ("failed", "cancelled") else OK)


def schema(kind: str = typer.Argument("job", help="job, policy or triggers")) -> None:
    """Print the JSON Schema of a user file, for editors."""
    if kind == "job":
        from trainmaster.jobs.spec import job_schema

        print(json.dumps(job_schema(), indent=2))
    elif kind == "policy":
        from trainmaster.broker.planning.policy import Policy

        print(json.dumps(Policy.model_json_schema(), indent=2))
    elif kind == "triggers":
        from trainmaster.broker.daemon.triggers.model import triggers_schema

        print(json.dumps(triggers_schema(), indent=2))
    else:
        fail(f"unknown schema {kind!r}; choose job, policy or triggers", USAGE)

"""How jobs and plans look to people (Rich), and plans to scripts (JSON; a job's JSON is broker/job_view.py's,
which the daemon's API gives too). Rich is imported by the functions that print with it, so the texts cost a lean
read (broker/cli/lean.py) no Rich at all.

Every string that came from outside (job names and ids, reasons, output paths, warnings) is printed
through `safe` (broker/cli/safe_text.py): control characters made visible, Rich markup escaped."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from trainmaster.broker.cli.safe_text import visible
from trainmaster.jobs.money import display_usd

if TYPE_CHECKING:
    from rich.console import Console

def safe(text: object) -> str:
    """broker/cli/safe_text.py `markup` (Rich's markup escape, imported when first printed)."""
    from trainmaster.broker.cli.safe_text import markup

    return markup(text)


STATE_STYLE = {"accepted": "green", "failed": "red", "cancelled": "yellow", "running": "cyan"}


def _when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _state(state: str, position: int | None = None) -> str:
    style = STATE_STYLE.get(state)
    shown = f"{state} #{position}" if position else state  # a queued job's place: #1 starts next
    return f"[{style}]{shown}[/{style}]" if style else shown


def print_job(console: Console, broker, job, *, events: bool = False) -> None:
    from trainmaster.broker.job_view import job_json

    data = job_json(broker.store, job, events=events)
    console.print(f"[bold]{safe(job.id)}[/bold]  {_state(job.state, data['queue_position'])}  ({safe(job.workload)}, "
                  f"policy {safe(job.policy)})", highlight=False, overflow="fold")  # wrapped to the terminal
    if job.reason:
        _print_folded(console, f"reason: {job.reason}")
    console.print(f"  cost: {display_usd(data['cost_micro_usd'])}   bundle: {safe(job.bundle_sha256[:16])}…", highlight=False,
                  soft_wrap=True)
    console.print(f"  job dir: {safe(data['job_dir'])}", highlight=False, soft_wrap=True)
    if data["outputs_dir"]:
        console.print(f"  outputs: [bold]{safe(data['outputs_dir'])}[/bold]", highlight=False, soft_wrap=True)
    if data["outputs_url"]:
        console.print(f"  shared outputs: [bold]{safe(data['outputs_url'])}[/bold] (`trainmaster outputs {safe(job.id)}`)",
                      highlight=False, soft_wrap=True)
    from rich.table import Table

    table = Table("#", "backend", "state", "started", "ended", "cost", box=None)
    for column in table.columns:
        column.no_wrap = True
    for a in data["attempts"]:
        table.add_row(safe(a["id"].rsplit(".", 1)[-1]), safe(a["backend"]), _state(a["state"]), _when(a["started_at"]),
                      _when(a["ended_at"]), display_usd(a["cost_micro_usd"] or 0))
    console.print(table)
    for a in data["attempts"]:  # below the table, folded to the terminal's width: a narrow column would hold a word a line
        if a["reason"] and a["reason"] not in (job.reason or ""):  # the job's reason, printed above, holds it
            _print_folded(console, f"#{a['id'].rsplit('.', 1)[-1]}: {a['reason']}")
    _print_payments(console, data["payments"])
    for a in data["attempts"]:
        for f in a["outputs"] if a["state"] == "accepted" else []:
            console.print(f"    {safe(f['path'])}  ({f['size']:,} bytes, sha256 {safe(f['sha256'][:12])}…)", highlight=False,
                          soft_wrap=True)
        _print_opaque(console, a["opaque"] if a["state"] == "accepted" else [])
        _print_dropped(console, a["dropped"])
    if events:
        _print_events(console, data, shown={job.reason, *(a["reason"] for a in data["attempts"])} - {None})


def _print_payments(console: Console, payments: list[dict]) -> None:
    """Each payment that moves money: sent (its transfer) or pending (why, and when it is tried next)."""
    from trainmaster.broker.payment_states import PaymentState, sentence

    for p in payments:
        if p["state"] == "receipt":
            continue  # the amount travels in the executor's receipt: nothing of ours to watch
        state = PaymentState(**{k: v for k, v in p.items() if k != "tao"})
        line = f"#{p['attempt_id'].rsplit('.', 1)[-1]} {sentence(state, _when)}"
        _print_folded(console, line, style="yellow" if p["state"] == "pending" else None)


LONG_REASON = 40
"""A reason longer than this is printed once: the event log points back to it rather than repeating it."""


def _print_events(console: Console, data: dict, shown: set[str]) -> None:
    """The event log: each transition once, labelled `job` or `attempt #n`; a long reason already printed
    (above, or on an earlier event) is pointed to, not repeated; a cost event shows its amount and basis."""
    from rich.table import Table

    log = Table("time", "of", "event", box=None)
    for column in log.columns[:2]:
        column.no_wrap = True
    for e in data["events"]:
        log.add_row(_when(e["at"]), safe(_subject(e)), safe(_event_text(e, shown)))
    console.print(log)


def _subject(event: dict) -> str:
    """Whose event it is: the job's own transitions are `job`, whatever attempt caused them."""
    if event["attempt"] is None or event["kind"] == "transition":
        return "job"
    return f"attempt #{event['attempt'].rsplit('.', 1)[-1]}"


def _event_text(event: dict, shown: set[str]) -> str:
    detail = event["detail"] or {}
    if event["kind"] == "cost":
        return f"cost {display_usd(detail.get('micro_usd') or 0)} ({detail.get('basis') or 'no basis recorded'})"
    if event["kind"] == "rate":
        return rate_text(detail)
    what = f"{event['from'] or ''} → {event['to']}" if event["to"] else event["kind"]
    reason = detail.get("reason") or detail.get("message")
    if not reason:
        return what
    if len(reason) > LONG_REASON and reason in shown:
        return f"{what} (reason above)"
    shown.add(reason)
    return f"{what} ({reason})"

def rate_text(detail: dict) -> str:
    """A recorded TAO/USD rate: where it was used, its value, its source and time, and STALE when it was older than
    the policy's `tao_rate.max_age_s` there."""
    per_tao = display_usd(detail.get("micro_usd_per_tao") or 0)
    stale = " — STALE" if detail.get("rate_stale") else ""
    return (f"TAO rate at {detail.get('at') or '?'}: {per_tao} per TAO from {detail.get('rate_source') or '?'}, "
            f"taken {_when(detail.get('rate_at'))}{stale}")


def _print_folded(console: Console, text: str, indent: int = 2, style: str | None = None) -> None:
    """`text` wrapped at word boundaries to the console's width, each of its lines on its own, every line
    indented (a word longer than a line is folded, never cut)."""
    from rich.padding import Padding
    from rich.text import Text

    for line in text.split("\n"):  # a reason's own lines stay lines; other control characters are made visible
        console.print(Padding(Text(visible(line), overflow="fold", style=style or ""), (0, 0, 0, indent)))


def _print_opaque(console: Console, opaque: list[dict]) -> None:
    if not opaque:
        return
    from trainmaster.broker.cli.save_hints import save_hint

    console.print("  [yellow]opaque outputs[/yellow]: pickle-capable, kept and hashed but never loaded by trainmaster; "
                  "load them only if you trust the code that wrote them:", highlight=False, soft_wrap=True)
    for item in opaque:
        console.print(f"    {safe(item['path'])}: {safe(item['what'])}", highlight=False, soft_wrap=True)
    hint = save_hint(" ".join(f"{item['path']} {item['what']}" for item in opaque))
    console.print(f"  to return weights trainmaster can check: {hint}", highlight=False, soft_wrap=True, markup=False)


def _print_dropped(console: Console, dropped: list[str]) -> None:
    if not dropped:
        return
    console.print("  [yellow]dropped outputs[/yellow]: not bound to the executor's signed commitment, so not kept:",
                  highlight=False, soft_wrap=True)
    for path in dropped:
        console.print(f"    {path}", highlight=False, soft_wrap=True, markup=False)


def print_jobs(console: Console, broker, jobs, *, recent_only: bool = False, wide: bool = False) -> None:
    if not jobs:
        console.print("no jobs running, and none ended in the last 24 hours (--all lists every job)"
                      if recent_only else "no jobs")
        return
    from rich.text import Text

    from trainmaster.broker import attempt_view
    from trainmaster.broker.cli.fitted import Column, Fitted

    table = Fitted([Column("job", 0, least=12, whole_first=True), Column("workload", 3, least=8), Column("state", 0),
                    Column("created", 1), Column("cost", 1, right=True)])
    for job in jobs:
        cost = sum(map(attempt_view.cost, broker.store.attempts(job.id)))
        table.add_row(visible(job.id), visible(job.workload),
                      Text.from_markup(_state(job.state, broker.store.queue_position(job.id))),
                      _when(job.created_at), display_usd(cost))
    table.print(console, wide=wide)


def prepared_json(prepared) -> dict:
    spec = prepared.loaded.spec
    chosen = prepared.plan.chosen
    return {
        "name": spec.name, "workload": spec.workload, "policy": prepared.policy.name,
        "bundle": {"sha256": prepared.bundle.sha256, "bytes": prepared.bundle.size, "files": prepared.bundle.files},
        "chosen": chosen.offer.model_dump(mode="json") if chosen else None,
        "considered": [
            {"offer": r.offer.model_dump(mode="json"), "hours": r.hours, "expected_micro_usd": r.expected_micro_usd,
             "verdict": r.verdict}
            for r in prepared.plan.rows
        ],
        "unavailable": prepared.plan.reasons,
        "warnings": list(prepared.warnings),
        "budget": prepared.budget,
        "estimate": prepared.plan.basis,
        "start": prepared.start,
    }


def print_prepared(console: Console, prepared, *, wide: bool = False) -> None:
    from trainmaster.broker.cli.plan_table import render_plan  # the planner: only what shows a plan imports it

    spec = prepared.loaded.spec
    console.print(f"[bold]{safe(spec.name)}[/bold] ({safe(spec.workload)}) — dry run, nothing submitted", highlight=False,
                  soft_wrap=True)
    console.print(f"  bundle: {prepared.bundle.sha256[:16]}… ({prepared.bundle.files} files, {prepared.bundle.size:,} "
                  "bytes)", highlight=False)
    render_plan(prepared.plan).print(console, wide=wide)
    for backend, why in prepared.plan.reasons.items():
        console.print(f"  {safe(backend)}: {safe('; '.join(why))}", highlight=False)
    console.print(f"  estimate: {safe(prepared.plan.basis)}", highlight=False)
    if prepared.start:
        console.print(f"  start: {safe(prepared.start)}", highlight=False)
    for warning in prepared.warnings:
        console.print(f"  [yellow]![/yellow] {safe(warning)}", highlight=False)
    if prepared.budget:
        console.print(f"  [red]✘[/red] submit would fail the job: {safe(prepared.budget)}", highlight=False,
                      soft_wrap=True)

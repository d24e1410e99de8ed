"""The lean read path: `ls`, `status JOB` and `spend` answered before typer, and without Rich when Rich would
print no styles (stdout is no terminal), so a read costs little more than a bare interpreter.

`trainmaster`'s `main` calls `answer(args)` before it builds the typer app (as it answers `--help` from a file).
Only the plain forms are taken: `ls [--all|-a] [--limit N] [--json] [--wide]`, `status JOB [--json]`,
`spend [--by GROUP] [--json]`. Anything else (another option, `--help`, an error such as an unknown job, a
line Rich would wrap, a warning to show) returns None before anything is printed, and the typer app answers
as it always has: the same output, the same exit codes. The reads are broker/cli/local_jobs.py's, so a read
with unfinished work (a job, a payment not sent yet) starts the background pass here too (broker/cli/reads.py).
"""

from __future__ import annotations

import json
import sys

SPEND_GROUPS = ("backend", "class", "job", "project", "month")
"""broker/cli/cost.py's, checked equal by tests/broker/cli/test_cli_lean_reads.py (that module imports typer)."""
RECENT_S = 24 * 3600
"""broker/cli/jobs.py's `RECENT_S`."""


def answer(args: list[str]) -> int | None:
    """The exit code of the read `args` names, answered here; None to leave it to the typer app."""
    command, rest = (args[0], args[1:]) if args else ("", [])
    parse = {"ls": _ls_args, "status": _status_args, "spend": _spend_args}.get(command)
    options = parse(rest) if parse else None
    if options is None:
        return None
    try:
        out = {"ls": _ls, "status": _status, "spend": _spend}[command](**options)
    except Exception:  # noqa: BLE001 — the typer app reports it, as always (its message, its exit code)
        return None
    if out is None:
        return None
    text, code = out
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


def _flags(rest: list[str], flags: dict[str, str], valued: dict[str, str]) -> dict | None:
    """{name: value} of the given flags (True when present) and valued options; None on anything else."""
    found: dict = {}
    positional: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        name, _, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if arg in flags:
            found[flags[arg]] = True
        elif name in valued:
            if not value:
                if i + 1 >= len(rest):
                    return None
                i, value = i + 1, rest[i + 1]
            found[valued[name]] = value
        elif not arg.startswith("-") and arg:
            positional.append(arg)
        else:
            return None
        i += 1
    found["_positional"] = positional
    return found


def _ls_args(rest: list[str]) -> dict | None:
    found = _flags(rest, {"--all": "all_", "-a": "all_", "--json": "as_json", "--wide": "wide"}, {"--limit": "limit"})
    if found is None or found.pop("_positional"):
        return None
    limit = found.pop("limit", "50")
    if not limit.isdigit():
        return None
    return {"all_": found.get("all_", False), "limit": int(limit), "as_json": found.get("as_json", False),
            "wide": found.get("wide", False)}


def _status_args(rest: list[str]) -> dict | None:
    found = _flags(rest, {"--json": "as_json"}, {})
    if found is None or len(found["_positional"]) != 1:
        return None
    return {"job_ref": found["_positional"][0], "as_json": found.get("as_json", False)}


def _spend_args(rest: list[str]) -> dict | None:
    found = _flags(rest, {"--json": "as_json"}, {"--by": "by"})
    if found is None or found.pop("_positional") or found.get("by", "backend") not in SPEND_GROUPS:
        return None
    return {"by": found.get("by"), "as_json": found.get("as_json", False)}


def _dumped(value) -> str:
    return json.dumps(value, indent=2) + "\n"


def _lines(lines: list[str] | None) -> str | None:
    return None if lines is None else "".join(f"{line}\n" for line in lines)


def _ls(all_: bool, limit: int, as_json: bool, wide: bool):
    import time

    from trainmaster.broker import job_view
    from trainmaster.broker.cli import render
    from trainmaster.broker.cli.local_jobs import read_jobs

    view, jobs = read_jobs(None, limit or -1, None if all_ else time.time() - RECENT_S)
    try:
        if as_json:
            return _dumped([job_view.job_json(view.store, j) for j in jobs]), 0
        from trainmaster.broker.cli import plain

        at = plain.width()
        if not plain.usable() or at is None:
            return None
        if not jobs:
            return _lines([plain.line("no jobs running, and none ended in the last 24 hours (--all lists every job)"
                                      if not all_ else "no jobs", at)]), 0
        from trainmaster.broker import attempt_view
        from trainmaster.broker.cli.safe_text import visible
        from trainmaster.jobs.money import display_usd

        rows = []
        for job in jobs:
            cost = sum(map(attempt_view.cost, view.store.attempts(job.id)))
            position = view.store.queue_position(job.id)
            rows.append([visible(job.id), visible(job.workload), f"{job.state} #{position}" if position else job.state,
                         render._when(job.created_at), display_usd(cost)])
        columns = [("job", 0, 12, True, False), ("workload", 3, 8, False, False), ("state", 0, None, False, False),
                   ("created", 1, None, False, False), ("cost", 1, None, False, True)]
        text = _lines(plain.fitted(columns, rows, at, wide=wide))
        return None if text is None else (text, 0)
    finally:
        view.store.close()


def _status(job_ref: str, as_json: bool):
    from trainmaster.broker import job_view
    from trainmaster.broker.cli.local_jobs import read_status

    view, job = read_status(job_ref)
    try:
        from trainmaster.broker.cli.reads import waiting_on_us

        if waiting_on_us(view.store, job):
            return None  # shown with its note, as it always was
        data = job_view.job_json(view.store, job, events=True)
        code = 1 if job.state in ("failed", "cancelled") else 0
        if as_json:
            return _dumped(data), code
        from trainmaster.broker.cli import plain

        at = plain.width()
        if not plain.usable() or at is None:
            return None
        text = _lines(_job_lines(data, job, at))
        return None if text is None else (text, code)
    finally:
        view.store.close()


def _job_lines(data: dict, job, at: int) -> list[str] | None:
    """render.print_job's lines as Rich prints them to a pipe; None where it would do more than lay them out."""
    from trainmaster.broker.cli import plain, render
    from trainmaster.broker.cli.safe_text import visible
    from trainmaster.jobs.money import display_usd

    if any(p["state"] != "receipt" for p in data["payments"]) or any(a["opaque"] or a["dropped"]
                                                                     for a in data["attempts"]):
        return None  # shown with Rich, as they always were
    position = data["queue_position"]
    state = f"{job.state} #{position}" if position else job.state
    out = [plain.line(f"{visible(job.id)}  {state}  ({visible(job.workload)}, policy {visible(job.policy)})", at)]
    folded = [f"reason: {job.reason}"] if job.reason else []
    out += [plain.padded(visible(part), 2, at) for text in folded for part in text.split("\n")]
    out.append(f"  cost: {display_usd(data['cost_micro_usd'])}   bundle: {visible(job.bundle_sha256[:16])}…")
    out.append(f"  job dir: {visible(data['job_dir'])}")
    if data["outputs_dir"]:
        out.append(f"  outputs: {visible(data['outputs_dir'])}")
    if data["outputs_url"]:
        out.append(f"  shared outputs: {visible(data['outputs_url'])} (`trainmaster outputs {visible(job.id)}`)")
    attempts = plain.table(["#", "backend", "state", "started", "ended", "cost"],
                           [[visible(a["id"].rsplit(".", 1)[-1]), visible(a["backend"]), a["state"],
                             render._when(a["started_at"]), render._when(a["ended_at"]),
                             display_usd(a["cost_micro_usd"] or 0)] for a in data["attempts"]], at)
    if attempts is None:
        return None
    out += attempts
    for a in data["attempts"]:
        if a["reason"] and a["reason"] not in (job.reason or ""):
            text = f"#{a['id'].rsplit('.', 1)[-1]}: {a['reason']}"
            out += [plain.padded(visible(part), 2, at) for part in text.split("\n")]
    for a in data["attempts"]:
        for f in a["outputs"] if a["state"] == "accepted" else []:
            out.append(f"    {visible(f['path'])}  ({f['size']:,} bytes, sha256 {visible(f['sha256'][:12])}…)")
    shown = {job.reason, *(a["reason"] for a in data["attempts"])} - {None}
    events = plain.table(["time", "of", "event"],
                         [[render._when(e["at"]), visible(render._subject(e)), visible(render._event_text(e, shown))]
                          for e in data["events"]], at)
    if events is None:
        return None
    out += events
    return None if any(line is None for line in out) else out


def _spend(by: str | None, as_json: bool):
    from pathlib import Path

    from trainmaster.broker import paths
    from trainmaster.jobs.money import RAO_PER_TAO, display_usd, format_usd
    from trainmaster.wallet.spend import SpendRow, spend_rows

    db = paths.state_db()
    if isinstance(db, Path) and not db.exists() and (not db.parent.exists() or db.parent.is_dir()):
        rows, unsent, pending = ([] if by else [SpendRow("total", 0, 0, 0)]), {}, []
    else:
        from trainmaster.broker.cli.reads import advance_in_background
        from trainmaster.broker.payment_states import payment_states, unsent_by_group
        from trainmaster.broker.store import Store

        store = Store(db)
        try:
            rows, unsent, pending = (spend_rows(store.db, by), unsent_by_group(store.db, by),
                                     payment_states(store.db, pending_only=True))
            advance_in_background(store)  # a payment not sent yet is sent there (or by the daemon), never here
        finally:
            store.close()
    if as_json:
        return _dumped([{"group": r.group, "usd": format_usd(r.micro_usd), "micro_usd": r.micro_usd, "rao": r.rao,
                         "charges": r.charges, "unsent_payments": unsent.get(r.group, (0, 0))[0],
                         "unsent_rao": unsent.get(r.group, (0, 0))[1]} for r in rows]), 0
    from trainmaster.broker.cli import plain
    from trainmaster.broker.cli.safe_text import visible

    at = plain.width()
    if pending or not plain.usable() or at is None:
        return None  # the payments not sent yet are shown with Rich
    body = [[visible(r.group), display_usd(r.micro_usd), f"{r.rao / RAO_PER_TAO:,.4f}" if r.rao else "", str(r.charges)]
            for r in rows]
    if by and rows:
        body.append(["total", display_usd(sum(r.micro_usd for r in rows)), "", str(sum(r.charges for r in rows))])
    text = _lines(plain.table([by or "", "spent", "TAO", "charges"], body, at, title="Spend (charged)",
                              caption=None if rows else "nothing charged yet"))
    return None if text is None else (text, 0)

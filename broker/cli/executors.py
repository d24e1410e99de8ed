"""`trainmaster executors ls | ban | unban`: the executors we do not control, their record and their bans.

A rejected attempt bans its executor's hotkey and coldkey in every later job; these commands show
the bans with each executor's record, and let a person ban or lift a ban by hand. Module-level imports
stay typer-only so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import typer

from trainmaster.broker.cli.exits import USAGE, console, escape, fail, guarded

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output.")


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        name="executors", rich_markup_mode=None, no_args_is_help=True,
        help="Executors we do not control (miners): their record across jobs, and bans.",
    )
    group.command("ls")(ls)
    group.command("ban")(ban)
    group.command("unban")(unban)
    app.add_typer(group, name="executors")


def ls(
    as_json: bool = JSON_OPT,
    lifted: bool = typer.Option(False, "--lifted", help="Also list bans that were lifted."),
) -> None:
    """List every executor that ran an attempt (accepted, rejected, failed) and every ban."""
    records, bans = guarded(lambda: _read(lifted))
    if as_json:
        print(json.dumps({"executors": [{**r.__dict__, "attempts": r.attempts} for r in records],
                          "bans": [{**b.__dict__, "active": b.active} for b in bans]}, indent=2))
        return
    from rich.table import Table

    out = console()
    banned = {b.key for b in bans if b.active}
    table = Table("hotkey", "coldkey", "accepted", "rejected", "failed", "banned", box=None)
    for r in records:
        is_banned = r.hotkey in banned or (r.coldkey is not None and r.coldkey in banned)
        table.add_row(escape(r.hotkey), escape(r.coldkey or "—"), str(r.accepted), str(r.rejected), str(r.failed),
                      "[red]yes[/red]" if is_banned else "no")
    out.print(table if records else "no executor has run an attempt yet")
    if bans:
        shown = Table("banned", "kind", "since", "by", "reason", box=None)
        for b in bans:
            since = datetime.fromtimestamp(b.at, timezone.utc).strftime("%Y-%m-%d %H:%M")
            shown.add_row(escape(b.key), b.kind, since + ("" if b.active else " (lifted)"),
                          b.by + (f" ({b.job_id})" if b.job_id else ""), escape(b.reason))
        out.print(shown)


def ban(
    key: str = typer.Argument(..., help="The hotkey or coldkey (ss58 address) to ban."),
    coldkey: bool = typer.Option(False, "--coldkey", help="KEY is a coldkey: every hotkey of that owner is banned."),
    reason: str = typer.Option("banned by hand", "--reason", help="Why, for the record."),
) -> None:
    """Ban an executor's hotkey (or, with --coldkey, its owner) from every later job."""
    if not key.strip():
        fail("empty key: give the hotkey or coldkey to ban", USAGE)
    kind = "coldkey" if coldkey else "hotkey"
    added = guarded(lambda: _executors().ban(kind, key, reason=reason, by="user"))
    console().print(f"{kind} {escape(key)} {'banned' if added else 'was already banned'}", highlight=False)


def unban(key: str = typer.Argument(..., help="The hotkey or coldkey whose ban is lifted.")) -> None:
    """Lift the ban of a hotkey or coldkey: its offers are planned again."""
    lifted = guarded(lambda: _executors().lift(key))
    if not lifted:
        fail(f"{key} is not banned (`trainmaster executors ls` lists the bans)", USAGE)
    console().print(f"lifted the ban of {' and '.join(b.kind for b in lifted)} {escape(key)}", highlight=False)


def _executors():
    from trainmaster.broker import paths
    from trainmaster.broker.executors import Executors
    from trainmaster.broker.store import Store

    return Executors(Store(paths.state_db()).db)


def _read(lifted: bool):
    executors = _executors()
    return executors.records(), executors.bans(include_lifted=lifted)

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
    wide: bool = typer.Option(False, "--wide", help="Every column whole, however wide the lines."),
) -> None:
    """List every executor that ran an attempt (accepted, rejected, failed) and every ban."""
    records, bans = guarded(lambda: _read(lifted))
    if as_json:
        print(json.dumps({"executors": [{**r.__dict__, "attempts": r.attempts} for r in records],
                          "bans": [{**b.__dict__, "active": b.active} for b in bans]}, indent=2))
        return
    from rich.text import Text

    from trainmaster.broker.cli.fitted import Column, Fitted
    from trainmaster.broker.cli.safe_text import visible

    out = console()
    banned = {b.key for b in bans if b.active}
    table = Fitted([Column("hotkey", 0, least=13), Column("coldkey", 2, least=13), Column("accepted", 1, right=True),
                    Column("rejected", 1, right=True), Column("failed", 1, right=True), Column("banned", 0)])
    for r in records:
        is_banned = r.hotkey in banned or (r.coldkey is not None and r.coldkey in banned)
        table.add_row(visible(r.hotkey), visible(r.coldkey or "—"), str(r.accepted), str(r.rejected), str(r.failed),
                      Text("yes", style="red") if is_banned else "no")
    if records:
        table.print(out, wide=wide)
    else:
        out.print("no executor has run an attempt yet")
    if bans:  # the reason below each ban, folded to the width: never one word a line
        shown = Fitted([Column("banned", 0, least=13), Column("kind", 1), Column("since", 2), Column("by", 1, least=8)],
                       title="Bans")
        for b in bans:
            since = datetime.fromtimestamp(b.at, timezone.utc).strftime("%Y-%m-%d %H:%M")
            shown.add_row(visible(b.key), b.kind, since + ("" if b.active else " (lifted)"),
                          visible(b.by + (f" ({b.job_id})" if b.job_id else "")), note=visible(b.reason))
        shown.print(out, wide=wide)


def ban(
    key: str = typer.Argument(..., help="The hotkey or coldkey (ss58 address) to ban."),
    coldkey: bool = typer.Option(False, "--coldkey", help="KEY is a coldkey: every hotkey of that owner is banned."),
    reason: str = typer.Option("banned by hand", "--reason", help="Why, for the record."),
) -> None:
    """Ban an executor's hotkey (or, with --coldkey, its owner) from every later job."""
    if not key.strip():
        fail("empty key: give the hotkey or coldkey to ban", USAGE)
    from trainmaster.backends.bittensor.config import checked_ss58

    try:  # as backends.yaml checks a miner's keys: the checksum too, so a typo bans nobody silently
        checked_ss58(key.strip())
    except ValueError as exc:
        fail(str(exc), USAGE)
    key = key.strip()
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

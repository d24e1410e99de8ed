"""`trainmaster gc [--dry-run] [--json]`: give disk back under the retention policy (`retention.yaml` in the
config dir; broker/filekeeping/retention.py), saying what it frees, in bytes per kind (broker/filekeeping/reclaim.py).

Module-level imports stay typer-only so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json

import typer

from trainmaster.broker.cli.exits import console, guarded, load


def register(app: typer.Typer) -> None:
    app.command()(gc)


def gc(
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be freed; remove nothing."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Free disk: segments of accepted trusted runs (keeping the last and the audited ones; each attempt's
    backend releases its own) and the least recently used job environments beyond the cap, as retention.yaml
    says. Prints what it frees per kind."""
    import asyncio

    from trainmaster.broker.backend_set import envs_dir
    from trainmaster.broker.filekeeping import reclaim
    from trainmaster.broker.filekeeping.retention import load_retention

    retention = load(load_retention)
    envs = load(envs_dir)
    freed = guarded(lambda: asyncio.run(_reclaim(retention, envs, dry_run)))
    if as_json:
        print(json.dumps({"dry_run": dry_run, "bytes": reclaim.by_kind(freed), "total_bytes": sum(i.bytes for i in freed),
                          "items": [i.to_json() for i in freed]}, indent=2))
        return
    _print(freed, dry_run)


async def _reclaim(retention, envs, dry_run: bool) -> list:
    """What the policy lets go (each attempt's segments as its backend reports them), removed unless a dry run."""
    from trainmaster.broker.filekeeping import reclaim
    from trainmaster.broker.service import Broker

    broker = Broker()
    try:
        found = await reclaim.reclaimable(broker.store, retention, envs, broker.backend_of)
        return found if dry_run else await reclaim.remove(found)
    finally:
        broker.close()


def _print(freed: list, dry_run: bool) -> None:
    from trainmaster.broker.filekeeping import reclaim

    verb = "would free" if dry_run else "freed"
    out = console()
    for kind, size in reclaim.by_kind(freed).items():
        count = sum(i.count for i in freed if i.kind == kind)
        out.print(f"{kind:<13} {verb} {_mb(size):>10}  ({count} {'directory' if count == 1 else 'directories'})",
                  highlight=False)
    out.print(f"{'total':<13} {verb} {_mb(sum(i.bytes for i in freed)):>10}", highlight=False)
    for item in freed:
        out.print(f"  {item.kind}: {item.where} ({_mb(item.bytes)}): {item.why}", highlight=False, soft_wrap=True,
                  markup=False)


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"

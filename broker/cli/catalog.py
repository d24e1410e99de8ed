"""`trainmaster catalog refresh | show`: fetch current prices from the clouds' price APIs into the refreshed
layer (`$TRAINMASTER_HOME/catalogs`), and list the catalog layers in use.

Module-level imports stay typer-only so `trainmaster --help` stays fast. `refresh` exits 1 when a cloud
failed (the others are still written; the failed one keeps its earlier layer), 2 for an unknown cloud.
"""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from trainmaster.broker.cli.exits import BAD, USAGE, console, escape, fail, load

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output (prices in integer micro-USD).")
CLOUDS = ("aws", "gcp", "azure")


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="catalog", rich_markup_mode=None, no_args_is_help=True,
                        help="Cloud price catalogs: refresh from the price APIs, show layers.")
    group.command("refresh")(refresh)
    group.command("show")(show)
    app.add_typer(group, name="catalog")


def refresh(clouds: Optional[List[str]] = typer.Argument(None, help="aws, gcp, azure; default: all three."),
            regions: Optional[List[str]] = typer.Option(None, "--region", help="Also price the catalog's instances "
                                                        "in this region (repeatable): rows the shipped catalog has "
                                                        "not, kept by later refreshes."),
            as_json: bool = JSON_OPT) -> None:
    """Fetch current on-demand and spot prices for the catalog's instances from each cloud's price API
    (AWS Price List, Cloud Billing Catalog, Azure Retail Prices) and write them where offers and planning
    read them. A row an API does not price keeps its catalog price. Exit 1 when a cloud failed."""
    import asyncio

    from trainmaster.backends.catalog.refresh import refresh as refresh_cloud
    from trainmaster.broker import paths

    chosen = _clouds(clouds)
    folder = paths.refreshed_catalogs_dir()

    async def all_of_them():
        return await asyncio.gather(*(refresh_cloud(cloud, folder, regions=tuple(regions or ())) for cloud in chosen))

    outcomes = asyncio.run(all_of_them())
    if as_json:
        print(json.dumps([_outcome_json(o) for o in outcomes], indent=2))
    else:
        for outcome in outcomes:
            _print_outcome(outcome)
    if any(o.error for o in outcomes):
        raise typer.Exit(BAD)


def show(cloud: Optional[str] = typer.Argument(None, help="aws, gcp or azure; default: all three."),
         as_json: bool = JSON_OPT) -> None:
    """The catalog layers each cloud's prices come from (shipped < refreshed < yours), with their dates and rows."""
    import warnings

    from trainmaster.backends.catalog import load_catalog
    from trainmaster.broker import paths

    layers = []
    for name in _clouds([cloud] if cloud else None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            catalog = load(lambda: load_catalog(name, refreshed_dir=paths.refreshed_catalogs_dir(),
                                                override_dir=paths.config_dir() / "catalogs"))
        layers += [{"cloud": name, "layer": kind, **source}
                   for kind, source in zip(("shipped", "refreshed", "yours"), _named(catalog.sources, paths)) if source]
    if as_json:
        print(json.dumps(layers, indent=2))
        return
    from rich.table import Table

    table = Table("cloud", "layer", "date", "rows", "file", box=None)
    for layer in layers:
        table.add_row(layer["cloud"], layer["layer"], layer["date"], str(layer["rows"]), escape(layer["file"]))
    console().print(table)


def _named(sources, paths) -> list[dict | None]:
    """The catalog's sources as [shipped, refreshed or None, yours or None]."""
    refreshed, mine = str(paths.refreshed_catalogs_dir()), str(paths.config_dir() / "catalogs")
    slots: list[dict | None] = [None, None, None]
    for source in sources:
        slot = 1 if source.path.startswith(refreshed + "/") else 2 if source.path.startswith(mine + "/") else 0
        slots[slot] = {"file": source.path, "date": source.date.isoformat(), "rows": source.rows}
    return slots


def _clouds(names: list[str] | None) -> list[str]:
    unknown = [n for n in names or [] if n not in CLOUDS]
    if unknown:
        fail(f"no price catalog for {', '.join(unknown)}; choose from {', '.join(CLOUDS)}", USAGE)
    return list(dict.fromkeys(names)) if names else list(CLOUDS)


def _outcome_json(outcome) -> dict:
    return {"cloud": outcome.cloud, "ok": outcome.error is None, "error": outcome.error, "file": outcome.file,
            "refreshed_at": outcome.refreshed_at, "priced": outcome.priced, "unchanged": outcome.unchanged,
            "changed": [{"instance": c.instance, "region": c.region, "before_micro_usd": c.before_micro_usd,
                         "after_micro_usd": c.after_micro_usd, "spot_before_micro_usd": c.spot_before_micro_usd,
                         "spot_after_micro_usd": c.spot_after_micro_usd} for c in outcome.changed],
            "not_found": outcome.not_found, "added": outcome.added}


def _print_outcome(outcome) -> None:
    from rich.table import Table

    out = console()
    if outcome.error:
        console(stderr=True).print(f"[red]error:[/red] {outcome.cloud}: {escape(outcome.error)} "
                                   "(its earlier prices stay)", highlight=False, soft_wrap=True)
        return
    table = Table("cloud", "priced", "changed", "unchanged", "not found", "when", box=None,
                  title=escape(outcome.file), title_justify="left")
    table.add_row(outcome.cloud, str(outcome.priced), str(len(outcome.changed)), str(outcome.unchanged),
                  str(len(outcome.not_found)), outcome.refreshed_at)
    out.print(table)
    for change in outcome.changed:
        out.print(f"  {escape(change.instance)} ({escape(change.region)}): {_usd(change.before_micro_usd)} → "
                  f"{_usd(change.after_micro_usd)}/h, spot {_usd(change.spot_before_micro_usd)} → "
                  f"{_usd(change.spot_after_micro_usd)}/h", highlight=False)
    if outcome.added:
        out.print(f"  added: {escape(', '.join(outcome.added))}", highlight=False, soft_wrap=True)
    if outcome.not_found:
        more = len(outcome.not_found) - NOT_FOUND_SHOWN
        names = ", ".join(outcome.not_found[:NOT_FOUND_SHOWN]) + (f" and {more} more (--json)" if more > 0 else "")
        out.print(f"  not priced by the API (catalog price kept): {escape(names)}", highlight=False, soft_wrap=True)


NOT_FOUND_SHOWN = 6


def _usd(micro: int | None) -> str:
    from trainmaster.jobs.money import format_usd

    return "none" if micro is None else f"${format_usd(micro)}"

"""`trainmaster catalog refresh`: current prices from each cloud's price API, written as the refreshed layer.

For the rows the shipped catalog knows (same instances and regions), each cloud's fetcher (aws.py, gcp.py,
azure.py) asks its price API and answers a `Price` per row it found; those rows are written as
`<refreshed dir>/<cloud>.csv` (write.py), which `load_catalog` lays between the shipped catalog and the
user's. A row the API does not price keeps the shipped price and is left out of the file. On any failure
(no network, an HTTP error, an answer that does not parse) nothing is written: the earlier layer stays.

`regions` adds regions the shipped catalog has no rows for: every instance the catalog knows (its hardware
columns from its shipped row) is asked of the API in each of them, and the ones it prices are written as new
rows (`Outcome.added`). A region added so stays: a later refresh asks for the refreshed layer's rows too.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from trainmaster.backends.catalog.load import Catalog, CatalogRow, StaleCatalogWarning, load_catalog
from trainmaster.backends.catalog.refresh.write import Price, priced_row, write_layer
from trainmaster.jobs.yamlfile import FileError

__all__ = ["Change", "Outcome", "Price", "refresh"]


@dataclass(frozen=True)
class Change:
    instance: str
    region: str
    before_micro_usd: int
    after_micro_usd: int
    spot_before_micro_usd: int | None
    spot_after_micro_usd: int | None


@dataclass
class Outcome:
    """What a refresh of one cloud did: the file written and how its rows compare with the catalog in use before."""
    cloud: str
    file: str | None = None
    refreshed_at: str | None = None
    priced: int = 0
    changed: list[Change] = field(default_factory=list)
    unchanged: int = 0
    not_found: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    """Rows of regions the shipped catalog has not, priced by the API (`--region`)."""
    error: str | None = None


async def refresh(cloud: str, folder: Path, *, now: datetime | None = None, regions: tuple[str, ...] = ()) -> Outcome:
    """Fetch `cloud`'s prices for the shipped rows (and, in `regions`, for the catalog's instances) and write
    `<folder>/<cloud>.csv`; errors end in `Outcome.error`."""
    from trainmaster.backends.base import BackendError

    try:
        return await _refresh(cloud, folder, now or datetime.now(timezone.utc), regions)
    except (BackendError, OSError) as exc:
        return Outcome(cloud=cloud, error=str(exc))


def candidates(shipped: Catalog, before: dict[tuple[str, str], CatalogRow], regions: tuple[str, ...]) -> list[CatalogRow]:
    """The rows to ask prices for: the shipped ones, those an earlier refresh added, and each instance the catalog
    knows in each of `regions` (its hardware from its first shipped row, its price to be fetched)."""
    found = {row.key: row for row in shipped.rows}
    for key, row in before.items():
        found.setdefault(key, row)
    first: dict[str, CatalogRow] = {}
    for row in shipped.rows:
        first.setdefault(row.instance, row)
    for region in regions:
        for instance, row in first.items():
            found.setdefault((instance, region), replace(row, region=region))
    return list(found.values())


async def _refresh(cloud: str, folder: Path, now: datetime, regions: tuple[str, ...] = ()) -> Outcome:
    fetcher = importlib.import_module(f"trainmaster.backends.catalog.refresh.{cloud}")
    shipped, before = _catalogs(cloud, folder)
    asked = tuple(candidates(shipped, before, regions))
    prices: dict[tuple[str, str], Price] = await fetcher.prices(asked)
    rows = [priced_row(row, prices[row.key]) for row in asked if row.key in prices]
    if not rows:
        from trainmaster.backends.base import BackendError

        raise BackendError(f"{fetcher.API} priced none of the {len(shipped.rows)} {cloud} catalog rows; "
                           "the earlier prices stay")
    path = write_layer(folder, cloud, rows, source=fetcher.SOURCE, when=now)
    return _compare(cloud, path, now, rows, shipped, before, regions)


def _catalogs(cloud: str, folder: Path) -> tuple[Catalog, dict[tuple[str, str], CatalogRow]]:
    """The shipped catalog, and the rows in use before (shipped < the earlier refresh; shipped alone if that is broken)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StaleCatalogWarning)
        shipped = load_catalog(cloud)
        try:
            before = load_catalog(cloud, refreshed_dir=folder)
        except FileError:
            before = shipped
    return shipped, {row.key: row for row in before.rows}


def _compare(cloud: str, path: Path, now: datetime, rows: list[CatalogRow], shipped: Catalog,
             before: dict[tuple[str, str], CatalogRow], regions: tuple[str, ...] = ()) -> Outcome:
    outcome = Outcome(cloud=cloud, file=str(path), refreshed_at=now.isoformat(timespec="seconds"), priced=len(rows))
    for row in rows:
        old = before.get(row.key)
        if old is None:
            outcome.added.append(f"{row.instance} ({row.region})")
            continue
        if old.on_demand_micro_usd == row.on_demand_micro_usd and old.spot_micro_usd == row.spot_micro_usd:
            outcome.unchanged += 1
        else:
            outcome.changed.append(Change(row.instance, row.region, old.on_demand_micro_usd, row.on_demand_micro_usd,
                                          old.spot_micro_usd, row.spot_micro_usd))
    found = {row.key for row in rows}
    outcome.not_found = [f"{r.instance} ({r.region})" for r in shipped.rows if r.key not in found]
    missing = sorted(set(regions) - {row.region for row in rows})
    if missing:
        outcome.not_found += [f"the API priced no instance in {region}" for region in missing]
    return outcome

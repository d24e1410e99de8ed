"""Writing the refreshed layer: the rows an API priced, as `<folder>/<cloud>.csv`, atomically (temp + rename).

The file starts with `# refreshed: <UTC ISO timestamp>` (what `load_catalog` dates it by) and names the API
it came from; rows keep the shipped row's shape (GPUs, vCPUs, memory) with the fetched prices.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from pathlib import Path

from trainmaster.backends.catalog.load import COLUMNS, CatalogRow
from trainmaster.jobs.money import format_usd


@dataclass(frozen=True)
class Price:
    """What an API priced for one row; `spot` None when it gave no spot price (the shipped ratio is kept)."""
    on_demand: int
    spot: int | None = None


def priced_row(row: CatalogRow, price: Price) -> CatalogRow:
    """`row` at the fetched prices. Without a fetched spot price, spot keeps the shipped spot/on-demand ratio."""
    spot = price.spot if price.spot is not None else scaled_spot(row, price.on_demand)
    return replace(row, on_demand_micro_usd=price.on_demand, spot_micro_usd=spot)


def scaled_spot(row: CatalogRow, on_demand: int) -> int | None:
    """The shipped spot price scaled to a new on-demand price (the same discount), in integers."""
    if row.spot_micro_usd is None or row.on_demand_micro_usd == 0:
        return row.spot_micro_usd
    return (on_demand * row.spot_micro_usd * 2 + row.on_demand_micro_usd) // (row.on_demand_micro_usd * 2)


def write_layer(folder: Path, cloud: str, rows: list[CatalogRow], *, source: str, when: datetime) -> Path:
    """Write `<folder>/<cloud>.csv` from `rows`, replacing the old file only once the new one is complete."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{cloud}.csv"
    fd, temp = tempfile.mkstemp(dir=folder, prefix=f".{cloud}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            out.write(layer_text(cloud, rows, source=source, when=when))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return target


def layer_text(cloud: str, rows: list[CatalogRow], *, source: str, when: datetime) -> str:
    buffer = io.StringIO()
    buffer.write(f"# trainmaster refreshed price catalog: {cloud}. Written by `trainmaster catalog refresh`; "
                 "not for editing (put your own prices in <config dir>/catalogs).\n")
    buffer.write(f"# refreshed: {when.isoformat(timespec='seconds')}\n")
    buffer.writelines(f"# {line}\n" for line in source.splitlines())
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in sorted(rows, key=lambda r: (r.region, r.instance)):
        writer.writerow([cloud, row.instance, row.region, row.gpu_type or "", row.gpu_count, row.gpu_memory_gb or "",
                         row.vcpus, _gb(row.memory_mb), format_usd(row.on_demand_micro_usd),
                         "" if row.spot_micro_usd is None else format_usd(row.spot_micro_usd)])
    return buffer.getvalue()


def _gb(memory_mb: int) -> str:
    return format(Decimal(memory_mb) / 1024, "f").rstrip("0").rstrip(".") if memory_mb % 1024 else str(memory_mb // 1024)

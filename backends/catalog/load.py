"""Price catalogs: the shipped CSV per cloud, the refreshed layer over it, and the user's override file on top.

A catalog file starts with `#` comment lines, one of which is `# date: YYYY-MM-DD` (the day the
prices were taken) or, in a refreshed file, `# refreshed: <ISO timestamp>`, then a CSV header and one
row per (instance, region). The refreshed layer (`<refreshed dir>/<cloud>.csv`, written by
`trainmaster catalog refresh`) replaces shipped rows with the same key and adds new ones; the user's
file is laid over both. Prices are dollars in
the file and integer micro-USD in memory. The user's file (`<config dir>/catalogs/<cloud>.csv`,
never written by trainmaster) replaces shipped rows with the same instance and region and adds
new ones; without a date line its date is the file's modification day.

`backends` may not import `broker`, so callers pass the override folder (the broker passes
`paths.config_dir() / "catalogs"`). A catalog older than `max_age_days` raises a
StaleCatalogWarning naming the file, once per load.
"""

from __future__ import annotations

import csv
import io
import warnings
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from importlib import resources
from pathlib import Path

from trainmaster.jobs.money import parse_usd
from trainmaster.jobs.yamlfile import FileError

CLOUDS = ("aws", "gcp", "azure")
COLUMNS = ("cloud", "instance", "region", "gpu_type", "gpu_count", "gpu_memory_gb", "vcpus", "memory_gb",
           "on_demand_usd_per_hour", "spot_usd_per_hour")
DEFAULT_MAX_AGE_DAYS = 90


class StaleCatalogWarning(UserWarning):
    """Prices older than the configured age: they may be wrong; update the override file. Carries the file, its
    date, its age and the age allowed, so a command can say it once for every stale catalog (`stale_summary`)."""

    def __init__(self, message: str, path: str = "", dated: date | None = None, age_days: int = 0,
                 max_age_days: int = DEFAULT_MAX_AGE_DAYS):
        super().__init__(message)
        self.path, self.dated, self.age_days, self.max_age_days = path, dated, age_days, max_age_days


def stale_summary(found: list[StaleCatalogWarning]) -> str:
    """One line for every stale catalog a command met (each file once)."""
    by_path = {w.path or str(w): w for w in found}
    if not all(w.path for w in by_path.values()):
        return "; ".join(dict.fromkeys(str(w) for w in found))
    short = [Path(p).name for p in by_path]
    shown = {p: Path(p).name if short.count(Path(p).name) == 1 else p for p in by_path}  # a shared name: the path
    names = ", ".join(f"{shown[p]} ({w.dated}, {w.age_days} days)" for p, w in sorted(by_path.items()))
    most = min(w.max_age_days for w in by_path.values())
    return (f"price catalogs older than {most} days, so their prices may be wrong: {names}; "
            "`trainmaster catalog refresh` or an override file puts current ones in place")


@dataclass(frozen=True)
class CatalogRow:
    cloud: str
    instance: str
    region: str
    gpu_type: str | None
    gpu_count: int
    gpu_memory_gb: int | None
    vcpus: int
    memory_mb: int
    on_demand_micro_usd: int
    spot_micro_usd: int | None
    date: date
    source: str  # file:line

    @property
    def key(self) -> tuple[str, str]:
        return self.instance, self.region


@dataclass(frozen=True)
class CatalogSource:
    path: str
    date: date
    rows: int

    def age_days(self, today: date) -> int:
        return (today - self.date).days


@dataclass(frozen=True)
class Catalog:
    cloud: str
    rows: tuple[CatalogRow, ...]
    sources: tuple[CatalogSource, ...]

    def stale(self, max_age_days: int, today: date | None = None) -> list[CatalogSource]:
        today = today or _today()
        return [s for s in self.sources if s.age_days(today) > max_age_days]


def load_catalog(
    cloud: str, *, override_dir: Path | None = None, refreshed_dir: Path | None = None,
    max_age_days: int = DEFAULT_MAX_AGE_DAYS, today: date | None = None,
) -> Catalog:
    """The shipped catalog of `cloud` with the refreshed layer, then the override file (each if any) laid
    over it: shipped < refreshed < user. Warns when a layer is stale."""
    if cloud not in CLOUDS:
        raise ValueError(f"no price catalog for {cloud!r}; catalogs exist for {', '.join(CLOUDS)}")
    shipped = _shipped(cloud)
    rows = {row.key: row for row in shipped.rows}
    sources = list(shipped.sources)
    for folder in (refreshed_dir, override_dir):
        layer = folder / f"{cloud}.csv" if folder is not None else None
        if layer is not None and layer.is_file():
            found = read_catalog(layer, cloud)
            rows.update((row.key, row) for row in found.rows)
            sources += found.sources
    catalog = Catalog(cloud=cloud, rows=tuple(rows.values()), sources=tuple(sources))
    today = today or _today()
    for source in catalog.stale(max_age_days, today):
        warnings.warn(StaleCatalogWarning(
            f"{source.path}: prices dated {source.date} are {source.age_days(today)} days old (more than "
            f"{max_age_days}); they may be wrong. Put current prices in an override file.",
            str(source.path), source.date, source.age_days(today), max_age_days), stacklevel=2)
    return catalog


@lru_cache(maxsize=len(CLOUDS))
def _shipped(cloud: str) -> Catalog:
    resource = resources.files("trainmaster.backends.catalog") / f"{cloud}.csv"
    return read_catalog(Path(str(resource)), cloud, text=resource.read_text(encoding="utf-8"))


def read_catalog(path: Path, cloud: str, *, text: str | None = None) -> Catalog:
    """Parse one catalog file; raises FileError with `file:line: column: why` for every bad cell."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise FileError(path, [f"{path}: cannot read: {exc}"]) from None
    lines = text.splitlines()
    comments = [(i + 1, line) for i, line in enumerate(lines) if line.lstrip().startswith("#")]
    dated = _date_line(path, comments) or datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).date()
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise FileError(path, [f"{path}: no header line; expected: {','.join(COLUMNS)}"])
    header_line, header = numbered[0]
    columns = next(csv.reader([header]))
    _check_header(path, header_line, columns)
    problems, rows, seen = [], [], {}
    for line_no, line in numbered[1:]:
        cells = next(csv.reader(io.StringIO(line)))
        where = f"{path}:{line_no}"
        if len(cells) != len(columns):
            problems.append(f"{where}: expected {len(columns)} values, found {len(cells)}")
            continue
        try:
            row = _row(dict(zip(columns, (c.strip() for c in cells))), cloud, dated, where)
        except _CellError as exc:
            problems.append(f"{where}: {exc.column}: {exc}")
            continue
        if row.key in seen:
            problems.append(f"{where}: {row.instance} in {row.region} is already on line {seen[row.key]}")
            continue
        seen[row.key] = line_no
        rows.append(row)
    if problems:
        raise FileError(path, problems)
    return Catalog(cloud=cloud, rows=tuple(rows), sources=(CatalogSource(str(path), dated, len(rows)),))


DATE_LABELS = {"date": ("YYYY-MM-DD", date.fromisoformat),
               "refreshed": ("an ISO timestamp", lambda value: datetime.fromisoformat(value).date())}
"""The comment lines that date a file: `# date: 2025-07-01` by hand, `# refreshed: 2026-01-05T10:00:00+00:00`
by `trainmaster catalog refresh`."""


def _date_line(path: Path, comments: list[tuple[int, str]]) -> date | None:
    for line_no, line in comments:
        label, _, value = line.lstrip("# ").partition(":")
        label = label.strip().lower()
        if label in DATE_LABELS:
            expected, parse = DATE_LABELS[label]
            try:
                return parse(value.strip())
            except ValueError:
                raise FileError(path, [f"{path}:{line_no}: {label}: expected {expected}, got {value.strip()!r}"]) from None
    return None


def _check_header(path: Path, line_no: int, columns: list[str]) -> None:
    problems = [f"{path}:{line_no}: {c}: unknown column" for c in columns if c not in COLUMNS]
    missing = [c for c in COLUMNS if c not in columns]
    if missing:
        problems.append(f"{path}:{line_no}: missing column(s): {', '.join(missing)}")
    if problems:
        raise FileError(path, problems)


class _CellError(ValueError):
    def __init__(self, column: str, why: str):
        self.column = column
        super().__init__(why)


def _row(cells: dict[str, str], cloud: str, dated: date, where: str) -> CatalogRow:
    if cells["cloud"] != cloud:
        raise _CellError("cloud", f"this is the {cloud} catalog, but the row says {cells['cloud']!r}")
    for column in ("instance", "region"):
        if not cells[column]:
            raise _CellError(column, "must not be empty")
    gpu_count = _int(cells, "gpu_count", minimum=0)
    gpu_type = cells["gpu_type"] or None
    if gpu_count and gpu_type is None:
        raise _CellError("gpu_type", f"must name the GPU when gpu_count is {gpu_count}")
    return CatalogRow(
        cloud=cloud, instance=cells["instance"], region=cells["region"], gpu_type=gpu_type, gpu_count=gpu_count,
        gpu_memory_gb=_int(cells, "gpu_memory_gb", minimum=1) if cells["gpu_memory_gb"] else None,
        vcpus=_int(cells, "vcpus", minimum=1), memory_mb=_memory_mb(cells),
        on_demand_micro_usd=_usd(cells, "on_demand_usd_per_hour"),
        spot_micro_usd=_usd(cells, "spot_usd_per_hour") if cells["spot_usd_per_hour"] else None,
        date=dated, source=where,
    )


def _int(cells: dict[str, str], column: str, *, minimum: int) -> int:
    try:
        value = int(cells[column])
    except ValueError:
        raise _CellError(column, f"expected a whole number, got {cells[column]!r}") from None
    if value < minimum:
        raise _CellError(column, f"must be at least {minimum}")
    return value


def _memory_mb(cells: dict[str, str]) -> int:
    try:
        gb = Decimal(cells["memory_gb"])
    except InvalidOperation:
        raise _CellError("memory_gb", f"expected a number of GB, got {cells['memory_gb']!r}") from None
    if not gb.is_finite() or gb <= 0:
        raise _CellError("memory_gb", "must be a positive number of GB")
    return int(gb * 1024)


def _usd(cells: dict[str, str], column: str) -> int:
    try:
        micro = parse_usd(cells[column])
    except ValueError as exc:
        raise _CellError(column, str(exc)) from None
    if micro < 0:
        raise _CellError(column, "a price cannot be negative")
    return micro


def _today() -> date:
    return datetime.now(timezone.utc).date()

"""The considered-offers table (a Rich table): how `trainmaster offers` and `submit --dry-run` show a plan."""

from __future__ import annotations

from collections import Counter

from trainmaster.broker.planning.planner import CHOSEN, Considered, Plan
from trainmaster.jobs.money import display_usd


HEADERS = ("", "backend", "instance", "region", "GPUs", "spot", "$/hour", "hours", "expected", "of which",
           "chosen / why not")
NARROW = 120
"""Below this many columns the table leaves out region, spot and the cost breakdown, so every header stays whole."""
LEFT_OUT_WHEN_NARROW = {"region", "spot", "of which"}


def render_plan(plan: Plan, *, limit: int = 15, width: int | None = None):
    """The considered-offers table (a rich Table): the best `limit` rows, the rest summarised; on a
    console narrower than NARROW (`width`), without the columns it can best do without."""
    from trainmaster.broker.cli.safe_text import markup as escape
    from rich.table import Table

    shown = [h for h in HEADERS if not (width and width < NARROW and h in LEFT_OUT_WHEN_NARROW)]
    table = Table(*shown, box=None,
                  title=escape(f"Considered offers: {plan.workload}, {plan.objective}, chain {' → '.join(plan.tiers)}"))
    for column in table.columns[:-1]:
        column.no_wrap = True
    catalog_dates = set()
    for i, row in enumerate(plan.rows[:limit]):
        o = row.offer
        catalog = o.detail.get("price_source") == "catalog"
        if catalog:
            catalog_dates.add(o.detail.get("catalog_date", "?"))
        chosen = row.verdict == CHOSEN
        cells = dict(zip(HEADERS, [
            str(i + 1), o.backend, o.instance, o.region, f"{o.gpu_count}× {o.gpu_type}" if o.gpu_count else "CPU",
            "yes" if o.spot else "no", display_usd(o.price_per_hour_micro_usd * o.nodes) + ("*" if catalog else ""),
            f"{row.hours:.1f}", display_usd(row.expected_micro_usd), _extras(row),
        ]))
        verdict = "[bold green]✔ chosen[/bold green]" if chosen else escape(row.verdict)
        table.add_row(*(escape(cells[h]) for h in shown[:-1]), verdict, style="bold" if chosen else None)
    lines = [f"runtime: {plan.basis}"] if plan.basis else []
    if catalog_dates:
        lines.append(f"* catalog list price (dated {', '.join(sorted(catalog_dates))}), not a live quote")
    hidden = Counter(r.verdict for r in plan.rows[limit:])
    if hidden:
        lines.append(f"{sum(hidden.values()):,} more offers: " + "; ".join(f"{n:,} {v}" for v, n in hidden.most_common()))
    lines += plan.notes
    table.caption = "\n".join(map(escape, lines))
    table.caption_justify = "left"
    return table


def _extras(row: Considered) -> str:
    parts = [(row.verification_micro_usd, "audit"), (row.risk_micro_usd, "risk"), (row.transfer_micro_usd, "egress")]
    return " · ".join(f"{name} {display_usd(amount)}" for amount, name in parts if amount)

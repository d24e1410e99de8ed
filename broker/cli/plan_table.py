"""The considered-offers table (a Rich table): how `trainmaster offers` and `submit --dry-run` show a plan."""

from __future__ import annotations

from collections import Counter

from trainmaster.broker.planner import CHOSEN, Considered, Plan
from trainmaster.jobs.money import display_usd


def render_plan(plan: Plan, *, limit: int = 15):
    """The considered-offers table (a rich Table): the best `limit` rows, the rest summarised."""
    from trainmaster.broker.cli.safe_text import markup as escape
    from rich.table import Table

    table = Table(
        "", "backend", "instance", "region", "GPUs", "spot", "$/hour", "hours", "expected", "of which", "chosen / why not",
        title=escape(f"Considered offers: {plan.workload}, {plan.objective}, chain {' → '.join(plan.tiers)}"), box=None,
    )
    catalog_dates = set()
    for i, row in enumerate(plan.rows[:limit]):
        o = row.offer
        catalog = o.detail.get("price_source") == "catalog"
        if catalog:
            catalog_dates.add(o.detail.get("catalog_date", "?"))
        chosen = row.verdict == CHOSEN
        cells = [
            str(i + 1), o.backend, o.instance, o.region, f"{o.gpu_count}× {o.gpu_type}" if o.gpu_count else "CPU",
            "yes" if o.spot else "no", display_usd(o.price_per_hour_micro_usd * o.nodes) + ("*" if catalog else ""),
            f"{row.hours:.1f}", display_usd(row.expected_micro_usd), _extras(row),
        ]
        verdict = "[bold green]✔ chosen[/bold green]" if chosen else escape(row.verdict)
        table.add_row(*map(escape, cells), verdict, style="bold" if chosen else None)
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

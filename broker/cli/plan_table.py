"""The considered-offers table: how `trainmaster offers` and `submit --dry-run` show a plan.

Laid out to the terminal's width (broker/cli/fitted.py): backend, instance (a miner's 48-character hotkey
shortened in its middle), region, GPUs, price, runtime and expected cost come first; spot and the cost's
breakdown only where they fit (`--wide`: all of them); why an offer was not chosen is written below its row,
folded to the width, rather than squeezed into a column one word a line.
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text

from trainmaster.broker.cli.fitted import Column, Fitted
from trainmaster.broker.cli.safe_text import visible
from trainmaster.broker.planning.planner import CHOSEN, Considered, Plan
from trainmaster.jobs.money import display_usd

COLUMNS = [
    Column("#", 0, right=True), Column("backend", 1), Column("instance", 1, least=12), Column("region", 2, least=9),
    Column("GPUs", 3), Column("$/hour", 1, right=True), Column("time", 2, right=True),
    Column("expected", 0, right=True), Column("spot", 2), Column("of which", 6),
]


def render_plan(plan: Plan, *, limit: int = 15) -> Fitted:
    """The considered offers (the best `limit`, the rest summarised), to `print(console, wide=…)`."""
    table = Fitted(COLUMNS, title=visible(f"Considered offers: {plan.workload}, {plan.objective}, chain "
                                          f"{' → '.join(plan.tiers)}"))
    catalog_dates = set()
    for i, row in enumerate(plan.rows[:limit]):
        o = row.offer
        catalog = o.detail.get("price_source") == "catalog"
        if catalog:
            catalog_dates.add(o.detail.get("catalog_date", "?"))
        chosen = row.verdict == CHOSEN or (plan.partner is not None and row is plan.partner)
        cells = [str(i + 1), o.backend, o.instance, o.region, f"{o.gpu_count}× {o.gpu_type}" if o.gpu_count else "CPU",
                 display_usd(o.price_per_hour_micro_usd * o.nodes) + ("*" if catalog else ""), duration(row.hours),
                 display_usd(row.expected_micro_usd), "yes" if o.spot else "no", _extras(row)]
        shown = [Text(visible(c)) for c in cells]
        if chosen:
            shown[0] = Text("✔", style="bold green")
        partner = plan.partner is not None and row is plan.partner
        table.add_row(*shown, note=visible(row.verdict) if partner or not chosen else None,
                      style="bold" if chosen else "dim")
    lines = [f"runtime: {plan.basis}"] if plan.basis else []
    if any(r.verdict == CHOSEN for r in plan.rows[:limit]):
        lines.insert(0, "✔ the chosen offer; below each other offer, why it was not chosen")
    if catalog_dates:
        lines.append(f"* catalog list price (dated {', '.join(sorted(catalog_dates))}), not a live quote")
    hidden = Counter(r.verdict for r in plan.rows[limit:])
    if hidden:
        lines.append(f"{sum(hidden.values()):,} more offers: " + "; ".join(f"{n:,} {v}" for v, n in hidden.most_common()))
    lines += plan.notes
    table.caption = [visible(line) for line in lines]
    return table


def duration(hours: float) -> str:
    """A runtime as people read it: seconds, minutes or hours (never "0.0" hours for a short run)."""
    seconds = hours * 3600
    if seconds < 90:
        return f"{max(seconds, 0):.0f} s" if seconds >= 1 or seconds == 0 else "<1 s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{hours:,.1f} h"


def _extras(row: Considered) -> str:
    parts = [(row.verification_micro_usd, "audit"), (row.risk_micro_usd, "risk"), (row.transfer_micro_usd, "egress")]
    return " · ".join(f"{name} {display_usd(amount)}" for amount, name in parts if amount)

"""Cost commands: `offers`, `spend`, and `policy check | show`, added to the main app by `register`.

Module-level imports stay typer-only so `trainmaster --help` stays fast; each command imports
what it needs. Exit codes: 0 success, 1 the thing asked about is bad (invalid policy or job, no
offer can run the job), 2 usage or environment error (missing file, unreadable override).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from trainmaster.broker.cli.exits import BAD, OK, USAGE, console, escape, fail, guarded, load

SPEND_GROUPS = ("backend", "class", "job", "project", "month")
WIDE_OPT = typer.Option(False, "--wide", help="Every column whole, however wide the lines (default: fit the terminal).")


def register(app: typer.Typer) -> None:
    app.command("offers")(offers)
    app.command("spend")(spend)
    policy_app = typer.Typer(name="policy", help="Check and show cost policies.", no_args_is_help=True)
    policy_app.command("check")(policy_check)
    policy_app.command("show")(policy_show)
    app.add_typer(policy_app, name="policy")


def offers(
    job: Path = typer.Argument(..., help="The job file (job.yaml)."),
    policy: str = typer.Option("default", "--policy", "-p", help="Policy name or file."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    limit: int = typer.Option(15, "--limit", min=1, help="Rows shown in the table (the rest are summarised)."),
    wide: bool = WIDE_OPT,
) -> None:
    """Show the offers `submit` would consider for a job and its choice (budgets checked); a price catalog
    older than the policy allows is warned of. Submits nothing.
    Exit 0 when submit would start the job, 1 when it would not."""
    from trainmaster.broker.cli import calls
    from trainmaster.broker.cli.plan_table import render_plan
    from trainmaster.jobs.spec import load_spec

    spec = load(lambda: load_spec(job)).spec
    chosen_policy = _load_policy(policy)
    # a file the offers read besides the job's (a catalog override, backends.yaml) is the environment's: exit 2
    (result, budget), stale = _stale_catalogs(
        lambda: guarded(lambda: load(lambda: calls.offers(spec, chosen_policy), usage_on_error=True)))
    warnings_seen = list(dict.fromkeys(str(w) for w in stale))
    if as_json:
        print(json.dumps({"policy": chosen_policy.name, "warnings": warnings_seen, "budget": budget,
                          **result.as_dict()}, indent=2))
    else:
        out = console()
        if warnings_seen:  # every stale catalog in one line, folded to the terminal
            from trainmaster.backends.catalog.load import stale_summary

            console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(stale_summary(stale))}", highlight=False)
        render_plan(result, limit=limit).print(out, wide=wide)
        for backend, why in result.reasons.items():
            out.print(f"  {escape(backend)}: {escape('; '.join(why))}", highlight=False)
        if result.chosen is None:
            out.print(escape(result.explain_failure()), highlight=False)
        if budget:
            out.print(f"[red]✘[/red] submit would fail the job: {escape(budget)}", highlight=False, soft_wrap=True)
    raise typer.Exit(OK if result.chosen and not budget else BAD)


def _stale_catalogs(call):
    """`call()`'s result and the StaleCatalogWarnings it raised, for the command to show as its own warning (one
    line); any other warning is shown as the command's warnings are (broker/cli/log_setup.py)."""
    import warnings

    from trainmaster.backends.catalog import StaleCatalogWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StaleCatalogWarning)  # the other warnings keep the filters they have
        result = call()
    for other in (w for w in caught if not issubclass(w.category, StaleCatalogWarning)):
        warnings.showwarning(other.message, other.category, other.filename, other.lineno)
    return result, [w.message for w in caught if issubclass(w.category, StaleCatalogWarning)]


def spend(
    by: Optional[str] = typer.Option(None, "--by", help=f"Group by {', '.join(SPEND_GROUPS)}."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw a bar chart to this PNG file."),
) -> None:
    """What was actually charged, from the ledger; not re-priced. Compute paid by the hour (the local
    machine's power, a cloud) is charged what it ran however its attempt ended, failed and cancelled
    attempts included; an untrusted executor is charged (paid) for accepted work only."""
    if by is not None and by not in SPEND_GROUPS:
        fail(f"cannot group spend by {by!r}; choose one of {', '.join(SPEND_GROUPS)}", USAGE)
    rows, unsent, pending = guarded(lambda: _spend_rows(by))
    if as_json:
        print(json.dumps([_spend_json(r, unsent.get(r.group, (0, 0))) for r in rows], indent=2))
    else:
        console().print(_spend_table(rows, by))
        _print_pending(pending)
    if plot is not None:
        _plot(rows, by, plot)
        console(stderr=as_json).print(f"plot written to {escape(str(plot.resolve()))}", highlight=False, soft_wrap=True)


def _spend_rows(by: str | None) -> tuple[list, dict, list]:
    """The ledger's charges grouped `by`; per group, the (payments, rao) charged but not sent yet; and the
    pending payments themselves."""
    from trainmaster.broker import paths
    from trainmaster.wallet.ledger import Ledger, SpendRow

    db = paths.state_db()
    if isinstance(db, Path) and not db.exists() and (not db.parent.exists() or db.parent.is_dir()):
        return ([] if by else [SpendRow("total", 0, 0, 0)]), {}, []
    from trainmaster.broker.payment_states import payment_states, unsent_by_group
    from trainmaster.broker.store import Store

    from trainmaster.broker.cli.reads import advance_in_background

    store = Store(db)  # an unusable home or database is one clear error (StateUnavailable), as for every command
    try:
        shown = (Ledger(store.db).spend(by), unsent_by_group(store.db, by), payment_states(store.db, pending_only=True))
        advance_in_background(store)  # a payment not sent yet is sent there (or by the daemon), never by this read
        return shown
    finally:
        store.close()


def _spend_json(row, unsent: tuple[int, int]) -> dict:
    from trainmaster.jobs.money import format_usd

    return {"group": row.group, "usd": format_usd(row.micro_usd), "micro_usd": row.micro_usd, "rao": row.rao,
            "charges": row.charges, "unsent_payments": unsent[0], "unsent_rao": unsent[1]}


def _print_pending(pending: list) -> None:
    """The payments charged but not sent yet (a chain that was unreachable): each with why and its next try."""
    if not pending:
        return
    from rich.padding import Padding
    from rich.text import Text

    from trainmaster.broker.cli.render import _when
    from trainmaster.broker.cli.safe_text import visible
    from trainmaster.broker.payment_states import sentence

    out = console()
    out.print(f"[yellow]{len(pending)} payment(s) charged but not sent yet[/yellow] (the TAO column counts them):",
              highlight=False)
    for p in pending:
        line = f"{p.job_id} #{p.attempt_id.rsplit('.', 1)[-1]}: {sentence(p, _when)}"
        out.print(Padding(Text(visible(line), overflow="fold"), (0, 0, 0, 2)))


def _spend_table(rows: list, by: str | None):
    from rich.table import Table

    from trainmaster.jobs.money import RAO_PER_TAO, display_usd

    table = Table(by or "", "spent", "TAO", "charges", title="Spend (charged)", box=None)
    for row in rows:
        tao = f"{row.rao / RAO_PER_TAO:,.4f}" if row.rao else ""
        table.add_row(escape(row.group), display_usd(row.micro_usd), tao, str(row.charges))
    if by and rows:
        table.add_row("[bold]total[/bold]", display_usd(sum(r.micro_usd for r in rows)), "",
                      str(sum(r.charges for r in rows)))
    if not rows:
        table.caption = "nothing charged yet"
    return table


def _plot(rows: list, by: str | None, path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        fail("--plot needs matplotlib: pip install matplotlib", USAGE)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainmaster.jobs.money import MICRO_PER_USD

    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(rows) + 2), 3.5))
    ax.bar([r.group for r in rows], [r.micro_usd / MICRO_PER_USD for r in rows])  # floats for drawing only
    ax.set_ylabel("USD charged")
    ax.set_title(f"Spend by {by}" if by else "Spend")
    ax.tick_params(axis="x", labelrotation=45)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        fail(f"cannot write {path}: {exc}", USAGE)
    finally:
        plt.close(fig)


def policy_check(
    file: Path = typer.Argument(..., help="The policy file to check."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Check a policy file: exit 0 when valid, 1 with file:line: field errors when not."""
    from trainmaster.broker.planning.policy import load_policy
    from trainmaster.jobs.yamlfile import FileError

    if not file.exists():  # anything else that is there (a FIFO, a folder) is refused for what it is, unread
        fail(f"{file}: no such file", USAGE)
    try:
        checked = load_policy(file)
    except FileError as exc:
        if as_json:
            print(json.dumps({"file": str(file), "valid": False, "problems": exc.problems}, indent=2))
        else:
            console(stderr=True).print(escape(str(exc)), highlight=False, soft_wrap=True)
        raise typer.Exit(BAD) from None
    if as_json:
        print(json.dumps({"file": str(file), "valid": True, "name": checked.name}, indent=2))
    else:
        console().print(f"{escape(str(file))}: valid policy '{escape(checked.name)}' "
                         f"({len(checked.classes)} classes, {len(checked.budgets)} budgets)", highlight=False)


def policy_show(
    name: str = typer.Argument("default", help="A shipped or user policy name, or a file."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Show a policy: per class, the objective, the fallback chain and the constraints; budgets."""
    from trainmaster.broker.planning.policy import shipped
    from trainmaster.jobs.money import display_usd

    shown = _load_policy(name)
    if as_json:
        print(json.dumps(shown.model_dump(mode="json"), indent=2))
        return
    out = console()
    out.print(f"[bold]{escape(shown.name)}[/bold]: {escape(shown.description)}", highlight=False)
    out.print(_classes_table(shown))
    if shown.budgets:
        out.print(_budgets_table(shown))
    power = shown.power
    priced = (f"power: {power.gpu_watts} W per GPU + {power.host_watts} W host at "
              f"{display_usd(power.usd_per_kwh_micro)}/kWh (over backends.yaml)" if power
              else "power: backends.yaml's local.power (trainmaster backends show)")
    out.print(f"{priced}; catalogs warn after {shown.catalog.max_age_days} days"
              + ("; local only" if shown.local_only else ""), highlight=False)
    out.print(f"shipped policies: {', '.join(shipped())}", highlight=False)


def _classes_table(policy):
    from rich.table import Table

    from trainmaster.broker.planning.policy import tier_name
    from trainmaster.jobs.money import display_usd

    table = Table("class", "objective", "chain", "constraints", box=None)
    rows = [("(default)", policy.default)] + [(k.value, v) for k, v in policy.classes.items()]
    for name, cls in rows:
        c = cls.constraints
        limits = [
            f"backends {','.join(c.allowed_backends)}" if c.allowed_backends else "",
            f"regions {','.join(c.regions)}" if c.regions else "",
            f"GPUs {','.join(c.gpu_types)}" if c.gpu_types else "",
            "" if c.spot_allowed else "no spot",
            f"≤ {display_usd(c.max_usd_per_hour)}/h" if c.max_usd_per_hour is not None else "",
            "local only" if c.local_only else "",
        ]
        objective = cls.objective + (f" ({cls.deadline_hours:g} h)" if cls.deadline_hours else "")
        chain = " → ".join(tier_name(t) for t in cls.tiers)
        table.add_row(name, objective, escape(chain), "; ".join(x for x in limits if x) or "none")
    return table


def _budgets_table(policy):
    from rich.table import Table

    from trainmaster.jobs.money import display_usd

    table = Table("budget", "cap", "per", "scope", "alerts", box=None, title="Budgets")
    for b in policy.budgets:
        alerts = ", ".join(f"{p}%" for p in b.alert_at_percent) + (" → webhook" if b.webhook else "")
        table.add_row(escape(b.label), display_usd(b.cap) + ("" if b.hard else " (soft)"), b.period, b.scope or "all",
                      alerts)
    return table


def _load_policy(name: str):
    from trainmaster.broker.planning.policy import load_policy

    return load(lambda: load_policy(name))

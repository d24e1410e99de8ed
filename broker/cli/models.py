"""`trainmaster models ls|promote|rollback`: the accepted checkpoints, their versions in the MLflow model
registry and the `production` alias (broker/promotion/). `ls` reads the broker's records only; `promote` and
`rollback` move the alias in the registry and record the move.

Module-level imports stay typer-only (mlflow is imported only by the commands that call the registry).
"""

from __future__ import annotations

import json

import typer

from trainmaster.broker.cli.exits import BAD, USAGE, console, escape, fail, guarded


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="models", rich_markup_mode=None, no_args_is_help=True,
                        help="Accepted models, their MLflow registry versions and the production alias.")
    group.command("ls")(ls)
    group.command("promote")(promote)
    group.command("rollback")(rollback)
    app.add_typer(group, name="models")


def ls(
    model: str = typer.Argument(None, help="Only this registered model."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    wide: bool = typer.Option(False, "--wide", help="Every column whole, however wide the lines."),
) -> None:
    """Every accepted job's promotion: its model and version, the gate's decision (and why it failed), its
    metrics and cost; the production version marked."""
    rows = guarded(lambda: _rows(model))
    if as_json:
        print(json.dumps(rows, indent=2, sort_keys=True))
        return
    _table(rows, wide)


def promote(
    job_or_version: str = typer.Argument(..., help="A job id (or prefix), or a version number of --model."),
    model: str = typer.Option(None, "--model", help="The registered model (needed with a version number when "
                              "several are registered)."),
) -> None:
    """Point the production alias at a version by hand (the gate is not asked)."""
    from trainmaster.broker.promotion import manual

    name, version = _moved(lambda store: manual.promote(store, job_or_version, model))
    console().print(f"{escape(name)}: production is now version {version}")


def rollback(model: str = typer.Argument(None, help="The registered model (default: the only one).")) -> None:
    """Point the production alias back at the version it held before the current one."""
    from trainmaster.broker.promotion import manual

    name, version = _moved(lambda store: manual.rollback(store, model))
    console().print(f"{escape(name)}: rolled back, production is now version {version}")


def _moved(move) -> tuple[str, str]:
    from trainmaster.broker import paths
    from trainmaster.broker.promotion.manual import PromotionError
    from trainmaster.broker.promotion.mlflow_registry import RegistryError
    from trainmaster.broker.store import Store

    def run():
        store = Store(paths.state_db())
        try:
            return move(store)
        finally:
            store.close()

    try:
        return guarded(run)
    except PromotionError as exc:
        fail(str(exc), BAD)
    except RegistryError as exc:
        fail(str(exc), USAGE)


def _rows(model: str | None) -> list[dict]:
    from trainmaster.broker import paths
    from trainmaster.broker.promotion.manual import production
    from trainmaster.broker.promotion.records import PromotionStore

    records = PromotionStore(paths.state_db())
    try:
        promotions = records.all(model)
        current = {name: production(records, name) for name in {p.model_name for p in promotions if p.model_name}}
    finally:
        records.close()
    return [{"job_id": p.lineage.job_id, "job_name": p.lineage.job_name, "model": p.model_name,
             "version": p.version, "production": p.version is not None and current.get(p.model_name) == p.version,
             "state": p.state, "gate": p.gate, "gate_reasons": p.gate_reasons, "error": p.error,
             "metrics": p.lineage.metrics, "cost_micro_usd": p.lineage.cost_micro_usd,
             "bundle_sha256": p.lineage.bundle_sha256, "spec_sha256": p.lineage.spec_sha256,
             "commitment_root": p.lineage.commitment_root, "verdict_id": p.lineage.verdict_id}
            for p in promotions]


def _table(rows: list[dict], wide: bool = False) -> None:
    """The promotions, laid out to the terminal's width (broker/cli/fitted.py): the gate's reasons and a failed
    promotion's error below the row."""
    from trainmaster.broker.cli.fitted import Column, Fitted
    from trainmaster.broker.cli.safe_text import visible
    from trainmaster.jobs.money import display_usd

    out = console()
    if not rows:
        out.print("no accepted job has been recorded yet")
        return
    table = Fitted([Column("model", 0, least=10, whole_first=True), Column("version", 0),
                    Column("job", 1, least=12, whole_first=True), Column("state", 1),
                    Column("gate", 2), Column("cost", 1, right=True), Column("metrics", 3, least=16)])
    for row in rows:
        version = (row["version"] or "-") + (" (production)" if row["production"] else "")
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in sorted(row["metrics"].items()))
        notes = [f"error: {row['error']}" if row["error"] else None,
                 f"gate: {'; '.join(row['gate_reasons'])}" if row["gate_reasons"] else None]
        table.add_row(visible(row["model"] or "-"), visible(version), visible(row["job_id"]), visible(row["state"]),
                      visible(row["gate"] or "-"), display_usd(row["cost_micro_usd"] or 0), visible(metrics),
                      note=[visible(n) for n in notes if n])
    table.print(out, wide=wide)

"""`trainmaster backends check | show`: whether each backend can run jobs here, and its settings.

Both read `backends.yaml` in the user config dir (`backends.config`); neither uses the network nor
imports a cloud SDK. Module-level imports stay typer-only so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json

import typer

from trainmaster.broker.cli.exits import console, escape, load

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output.")


def register(app: typer.Typer) -> None:
    backends_app = typer.Typer(
        name="backends", rich_markup_mode=None, no_args_is_help=True,
        help="Whether each backend can run jobs here, and its settings (backends.yaml).",
    )
    backends_app.command("check")(check)
    backends_app.command("show")(show)
    app.add_typer(backends_app, name="backends")


def check(as_json: bool = JSON_OPT) -> None:
    """Say for each backend whether it can run jobs here and, if not, why (extra not installed, no
    credentials, not dispatched in this version), without using the network.

    Exit 0 whatever the answers: a backend that cannot run here is a fact about this machine, not a
    failed command (scripts read `ready` in --json). Exit 1 when backends.yaml is invalid.
    """
    from trainmaster.backends.registry import REGISTRY

    configs = _configs()
    rows = []
    for name, entry in REGISTRY.items():
        reasons, found = entry.readiness(configs[name])
        rows.append({"backend": name, "ready": not reasons, "implemented": entry.implemented, "extra": entry.extra,
                     "reasons": reasons, "found": found})
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    table = Table("backend", "ready", "why not / what was found", box=None)
    for row in rows:
        ready = "[green]yes[/green]" if row["ready"] else "[red]no[/red]"
        details = [escape(r) for r in row["reasons"]] + [f"[dim]{escape(f)}[/dim]" for f in row["found"]]
        table.add_row(row["backend"], ready, "\n".join(details))
    console().print(table)


def show(as_json: bool = JSON_OPT) -> None:
    """Print each backend's settings as used: backends.yaml laid over the defaults. Credentials are
    never kept there (only profile names and file paths); each SDK finds them itself."""
    from trainmaster.backends.config import config_file
    from trainmaster.broker import paths

    path = config_file(paths.config_dir())
    settings = {name: config.model_dump(mode="json") for name, config in _configs().items()}
    if as_json:
        print(json.dumps({"file": str(path), "exists": path.is_file(), "backends": settings}, indent=2))
        return
    import yaml

    out = console()
    out.print(f"{escape(str(path))}" + ("" if path.is_file() else " (absent: defaults)"), highlight=False)
    for name, values in settings.items():
        out.print(f"[bold]{name}[/bold]:", highlight=False)
        text = yaml.safe_dump(values, sort_keys=False, default_flow_style=False).rstrip()
        out.print("\n".join(f"  {line}" for line in text.splitlines()), highlight=False, markup=False)


def _configs() -> dict:
    """Each backend's config; an invalid backends.yaml exits 1 with file:line: field errors."""
    from trainmaster.backends.config import load_configs
    from trainmaster.broker import paths

    return load(lambda: load_configs(paths.config_dir()))

"""`trainmaster backends check | show`: whether each backend can run jobs here, and its settings as used
(`broker.backend_set`: backends.yaml, then the policy's overrides), with where each came from.

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


def show(as_json: bool = JSON_OPT,
         policy: str = typer.Option("default", "--policy", "-p", help="Policy whose overrides to apply.")) -> None:
    """Print each backend's settings as jobs under the policy use them, and where each value came from:
    its default, backends.yaml, the broker's default, or the policy (only for the fields a backend lets
    a policy set, such as local.power). Credentials are never kept there (only profile names and file
    paths); each SDK finds them itself."""
    from trainmaster.backends.config import config_file
    from trainmaster.broker import paths
    from trainmaster.broker.backend_set import configured
    from trainmaster.broker.planning.policy import load_policy

    path = config_file(paths.config_dir())
    chosen = load(lambda: load_policy(policy))
    used = {name: configured(config, chosen) for name, config in _configs().items()}
    settings = {name: eff.config.model_dump(mode="json") for name, eff in used.items()}
    sources = {name: eff.sources for name, eff in used.items()}
    if as_json:
        print(json.dumps({"file": str(path), "exists": path.is_file(), "policy": chosen.name, "backends": settings,
                          "sources": sources}, indent=2))
        return
    out = console()
    out.print(f"{escape(str(path))}" + ("" if path.is_file() else " (absent: defaults)")
              + f"; policy {escape(chosen.name)}", highlight=False)
    for name, values in settings.items():
        out.print(f"[bold]{name}[/bold]:", highlight=False)
        out.print("\n".join(_lines(values, sources[name])), highlight=False, markup=False)


def _lines(values: dict, sources: dict[str, str]) -> list[str]:
    """Each field as YAML, indented under its backend, its first line marked with where it came from."""
    import yaml

    lines = []
    for field, value in values.items():
        text = yaml.safe_dump({field: value}, sort_keys=False, default_flow_style=False).rstrip().splitlines()
        text[0] += f"  # {sources[field]}"
        lines += [f"  {line}" for line in text]
    return lines


def _configs() -> dict:
    """Each backend's config; an invalid backends.yaml exits 1 with file:line: field errors."""
    from trainmaster.broker.backend_set import read_configs

    return load(read_configs)

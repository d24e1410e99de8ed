"""The typer app behind `trainmaster` (the package's `main` imports it only for a real command).

Module-level imports in this package stay typer-only; everything else is imported inside the
command that needs it. Each module adds its commands with `register`.
"""

from __future__ import annotations

import sys

import typer

from trainmaster.broker.cli import (
    backends, catalog, cost, daemon, executors, gc, jobs, log_setup, miner, models, outputs, verify, wallet,
)

app = typer.Typer(
    name="trainmaster",
    help="Run each training job on the cheapest compute that meets its constraints, and verify what comes back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: Rich's help renderer alone costs ~0.15 s of start-up
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _options(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
    verbose: bool = typer.Option(False, "--verbose", "-v",
                                 help="Log info to stderr, not only warnings (TRAINMASTER_LOG_LEVEL=debug for more)."),
) -> None:
    log_setup.configure(verbose)
    if version:
        from importlib.metadata import version as installed

        print(f"trainmaster {installed('trainmaster')}")
        raise typer.Exit(0)

for _module in (jobs, outputs, cost, verify, backends, catalog, executors, gc, miner, wallet, models, daemon):
    _module.register(app)


def render_help() -> str:
    """The top-level help as the app prints it at 80 columns: what `help.txt` must hold."""
    from typer.testing import CliRunner

    return CliRunner().invoke(app, ["--help"], terminal_width=80, env={"COLUMNS": "80"}).output


if __name__ == "__main__":  # python -m trainmaster.broker.cli.commands > broker/cli/help.txt
    sys.stdout.write(render_help())

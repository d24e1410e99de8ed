"""The `trainmaster` command line (Typer + Rich); all of trainmaster's typer and Rich code lives here.

Exit codes: 0 success; 1 the thing asked about is bad (invalid spec, job failed, no backend can
run it); 2 usage or environment error (missing file, disk full, unreachable backend).
Module-level imports in this package stay typer-only so `trainmaster --help` is fast; everything
else is imported inside the command that needs it. Each module adds its commands with `register`.
"""

from __future__ import annotations

import typer

from trainmaster.broker.cli import backends, cost, jobs, verify

app = typer.Typer(
    name="trainmaster",
    help="Run each training job on the cheapest compute that meets its constraints, and verify what comes back.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: Rich's help renderer alone costs ~0.15 s of start-up
)

for _module in (jobs, cost, verify, backends):
    _module.register(app)


def main() -> None:
    app()

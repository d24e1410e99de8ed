"""The CLI invoked in this process (Typer's CliRunner over `trainmaster.broker.cli.app`), and the job JSON a
`submit --wait --json` printed."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from trainmaster.broker.cli import app


def run_cli(*args: str):
    return CliRunner().invoke(app, list(args))


def submitted(result) -> dict:
    """The job JSON `submit --wait --json` printed (after any log lines)."""
    return json.loads(result.output[result.output.index("{\n"):])

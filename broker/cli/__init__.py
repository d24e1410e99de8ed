"""The `trainmaster` command line (Typer + Rich); all of trainmaster's typer and Rich code lives here.

Exit codes: 0 success; 1 the thing asked about is bad (invalid spec, job failed, no backend can
run it); 2 usage or environment error (missing file, disk full, unreachable backend).

Start-up matters (`trainmaster --help` ≤ 0.10 s): importing typer alone costs more than that, so
`main` answers `trainmaster`, `--help`, `-h` and `--version` from a copy of the top-level help kept
beside this file (`help.txt`, checked against the app by tests/broker/cli/test_cli_fast_paths.py) and
imports the app (`commands.py`) only for a real command. The reads `ls`, `status` and `spend` are answered
before typer, and without Rich when stdout is no terminal (`lean.py`); they never advance a job (a daemon or
the background pass a read starts does, `background.py`). A real command imports only what it uses:
`ls` and `status` read the store without the Broker (`calls.py`, `job_client.py`), `exits.guarded` tells
our exceptions apart without importing them, and typer is kept below 0.29, whose pydantic coercion of
every option costs ~55 ms (tests/benchmarks/bench_cli.py prints each command's start-up;
tests/broker/cli/test_cli_lazy_imports.py checks what each imports).
"""

from __future__ import annotations

import sys
from pathlib import Path

HELP_FILE = Path(__file__).with_name("help.txt")


def main() -> None:
    args = sys.argv[1:]
    if args in ([], ["--help"], ["-h"]):
        sys.stdout.write(HELP_FILE.read_text())
        sys.exit(2 if not args else 0)  # no command is a usage error, as the app's own no_args_is_help
    if args == ["--version"]:
        from importlib.metadata import version

        print(f"trainmaster {version('trainmaster')}")
        return
    _private()
    if args and args[0] in ("ls", "status", "spend"):  # the reads, before typer when they can (broker/cli/lean.py)
        from trainmaster.broker.cli.lean import answer

        code = answer(args)
        if code is not None:
            sys.exit(code)
    from trainmaster.broker.cli.commands import app

    app()


def _private() -> None:
    """Everything a command writes under the home (state.db, launch.json, logs, verdicts, bundles) is the
    user's alone, whatever the shell's umask; a home others could read is tightened, with a note."""
    from trainmaster.broker import paths

    note = paths.make_private()
    if note:
        sys.stderr.write(f"note: {note}\n")


def __getattr__(name: str):
    """`from trainmaster.broker.cli import app` still works (tests, embedding), importing typer then."""
    if name == "app":
        from trainmaster.broker.cli.commands import app

        return app
    raise AttributeError(name)

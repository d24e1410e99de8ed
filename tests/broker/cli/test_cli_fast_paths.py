"""`trainmaster`, `--help`, `-h` and `--version` answer without importing typer, and say what the app would."""

from __future__ import annotations

import subprocess
import sys

from trainmaster.broker.cli import HELP_FILE


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True)


def test_the_kept_help_is_what_the_app_prints():
    from trainmaster.broker.cli.commands import render_help

    assert HELP_FILE.read_text() == render_help(), (
        "broker/cli/help.txt is stale: regenerate it with `python -m trainmaster.broker.cli.commands > broker/cli/help.txt`")


def test_help_and_h_print_it_and_succeed_and_no_command_is_a_usage_error():
    for args in (["--help"], ["-h"]):
        out = cli(*args)
        assert out.returncode == 0 and out.stdout == HELP_FILE.read_text()
    bare = cli()
    assert bare.returncode == 2 and "Commands:" in bare.stdout


def test_version_and_subcommand_help_work_through_the_app():
    from importlib.metadata import version

    assert cli("--version").stdout.strip() == f"trainmaster {version('trainmaster')}"
    sub = cli("status", "-h")
    assert sub.returncode == 0 and "status [OPTIONS]" in sub.stdout and "--json" in sub.stdout


def test_the_fast_paths_import_no_typer_and_no_broker():
    probe = ("import sys\nsys.argv = ['trainmaster', '--help']\nfrom trainmaster.broker.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'click', 'rich', 'torch') "
             "or m.startswith('trainmaster.broker.service')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stderr.strip() == "[]"

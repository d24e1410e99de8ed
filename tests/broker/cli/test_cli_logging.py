"""One logging set-up for the command line (broker/cli/log_setup.py): a budget alert the ledger logs reaches
stderr as a formatted `warning:` line, `--verbose` and TRAINMASTER_LOG_LEVEL choose the level, and the
libraries' own loggers stay quiet unless debug is asked for."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from trainmaster.broker.cli import log_setup

POLICY = """\
name: tight
default:
  primary: local
budgets:
  - name: tiny
    period: total
    cap: 0.01
    hard: false
    alert_at_percent: [1]
"""


def _submit(job_factory, tmp_path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    spec = job_factory("print('hi')\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    command = [sys.executable, "-m", "trainmaster.broker.cli", *flags, "submit", str(spec), "--policy", str(policy)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200", **env})


def test_a_budget_alert_reaches_stderr_as_a_formatted_warning(tm_home, job_factory, tmp_path, monkeypatch):
    monkeypatch.delenv(log_setup.LEVEL_ENV, raising=False)
    done = _submit(job_factory, tmp_path, {})
    assert done.returncode == 0, done.stderr
    assert "warning: budget 'tiny' reached 1% of its cap: $0.02 of $0.01 spent or reserved" in done.stderr.splitlines()
    assert "submitted" in done.stdout and "budget" not in done.stdout


def test_the_level_from_the_environment_can_silence_it(tm_home, job_factory, tmp_path):
    done = _submit(job_factory, tmp_path, {log_setup.LEVEL_ENV: "error"})
    assert done.returncode == 0, done.stderr
    assert "budget 'tiny'" not in done.stderr


def test_an_unknown_level_is_named_and_warnings_still_shown(tm_home, job_factory, tmp_path):
    done = _submit(job_factory, tmp_path, {log_setup.LEVEL_ENV: "loud"}, "-v")
    assert "warning: TRAINMASTER_LOG_LEVEL=loud is not one of debug, info, warning, error; logging warnings" in done.stderr
    assert "warning: budget 'tiny' reached" in done.stderr


@pytest.mark.parametrize(
    ("verbose", "env", "ours", "libraries"),
    [
        (False, {}, logging.WARNING, logging.ERROR),
        (True, {}, logging.INFO, logging.ERROR),
        (False, {log_setup.LEVEL_ENV: "DEBUG"}, logging.DEBUG, logging.DEBUG),
        (True, {log_setup.LEVEL_ENV: "error"}, logging.ERROR, logging.ERROR),  # the environment wins
    ],
)
def test_levels_for_ours_and_the_libraries(monkeypatch, verbose, env, ours, libraries):
    monkeypatch.delenv(log_setup.LEVEL_ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    for name in ("trainmaster", *log_setup.LIBRARIES):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "handlers", list(logging.getLogger().handlers))
    log_setup.configure(verbose)
    log_setup.configure(verbose)  # idempotent: one handler
    assert sum(isinstance(h, log_setup.RichStderr) for h in logging.getLogger().handlers) == 1
    assert logging.getLogger("trainmaster").level == ours
    assert {logging.getLogger(name).level for name in log_setup.LIBRARIES} == {libraries}


def test_library_warnings_are_quiet_and_ours_are_shown_through_the_cli_set_up():
    script = (
        "import logging\n"
        "from trainmaster.broker.cli import log_setup\n"
        "log_setup.configure(False)\n"
        "logging.getLogger('aiohttp.client').warning('library chatter')\n"
        "logging.getLogger('botocore.credentials').warning('found credentials somewhere')\n"
        "logging.getLogger('trainmaster.wallet.ledger').warning('job %s was charged more', 'j-1')\n"
        "logging.getLogger('trainmaster.wallet.ledger').info('not shown at the default level')\n"
    )
    env = {key: value for key, value in os.environ.items() if key != log_setup.LEVEL_ENV}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["warning: job j-1 was charged more"]

"""Small things of #15 §7, through the CLI: `status` stays readable in 80 columns (a reason is folded
to the width, once, not squeezed into a column one word a line); a spec naming the removed
`checkpoint.every_steps` is refused instead of silently ignored; `Backend.cancel` says what it returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing

NO_OUTPUTS = "print('trained, but wrote nothing')\n"


def tm(*args: str, home, columns: int = 200) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": str(columns)}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_status_in_80_columns_folds_reasons_readably(tm_home, job_factory):
    spec = job_factory(NO_OUTPUTS, "estimated_hours: 0.001\n")
    job = json.loads(tm("submit", str(spec), "--wait", "--json", home=tm_home).stdout)
    assert job["state"] == "failed"
    shown = tm("status", job["id"], home=tm_home, columns=80).stdout
    lines = shown.splitlines()
    assert all(len(line) <= 80 for line in lines if "job dir:" not in line), shown  # a path stays whole, to copy
    assert any(line.startswith("  reason: rejected: the run wrote no outputs: nothing is in its outputs") for line in lines), shown
    assert shown.count("the run wrote no outputs") == 1, shown  # the attempt's reason, held by the job's, is not repeated
    assert any("started" in line and "ended" in line and "cost" in line for line in lines)  # the table's header, whole
    words_alone = [line.strip() for line in lines if line.strip() and " " not in line.strip()]
    assert not [w for w in words_alone if w in ("outputs", "folder", "written", "anywhere")], shown


def test_the_unread_every_steps_is_refused_naming_the_field(tm_home, job_factory):
    spec = job_factory(NO_OUTPUTS, "checkpoint:\n  segment_steps: 25\n  every_steps: 50\n")
    out = tm("submit", str(spec), "--dry-run", home=tm_home)
    assert out.returncode == 1 and "checkpoint.every_steps: unknown field" in out.stderr, out.stderr


def test_cancel_is_typed_as_what_it_returns():
    from trainmaster.backends.base import Backend
    from trainmaster.backends.local import LocalBackend

    assert typing.get_type_hints(Backend.cancel)["return"] == int | None
    assert typing.get_type_hints(LocalBackend.cancel)["return"] is int  # a narrower answer: it can always tell

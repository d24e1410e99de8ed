"""A shell's script in an entrypoint is the shell's to expand: a job variable holding `$(…)` or backticks
stays text inside `"$VAR"`, as it would in plain bash, instead of being pasted into the script and run."""

from __future__ import annotations

import json

import pytest
from cli_run import tm

from trainmaster.jobs.environment import expand_command

TITLE = "$(touch PWNED) `touch PWNED2` ${HOME}"
TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


@pytest.mark.parametrize("shell", ["bash -c", "/bin/sh -c", "env bash -c", "bash -lc", "bash -e -o pipefail -c"])
def test_submit_wait_prints_a_hostile_title_as_text_and_runs_nothing(job_factory, tmp_path, shell):
    entrypoint = f"""{shell} 'echo "title=$PR_TITLE"; python train.py'"""
    spec = job_factory(TRAIN, "env:\n  PR_TITLE: '" + TITLE + "'\n", entrypoint=entrypoint)
    home = tmp_path / "home"
    out = tm("submit", str(spec), "--wait", home=home)
    assert out.returncode == 0, out.stdout + out.stderr
    job_id = json.loads(tm("ls", "--all", "--json", home=home).stdout)[0]["id"]
    log = tm("logs", job_id, home=home).stdout
    assert f"title={TITLE}" in log
    assert not [p for p in tmp_path.rglob("PWNED*")], "the title's commands ran"


@pytest.mark.parametrize("command, script_at", [
    ("bash -c 'echo $X'", 2),
    ("/usr/bin/zsh -c 'echo $X'", 2),
    ("dash -ec 'echo $X'", 2),
    ("env -i A=1 sh -c 'echo $X'", 5),
    ("timeout 60 bash --norc -o pipefail -c 'echo $X'", 7),
    ("bash -x -c 'echo $X' arg0", 3),
    ("$SHELL -c 'echo $X'", 2),
    ("bash -c -- 'echo $X'", 3),
])
def test_a_shells_script_is_left_as_written(command, script_at):
    words = expand_command(command, {"X": "$(boom)", "SHELL": "/bin/bash"})
    assert words[script_at] == "echo $X"


def test_words_outside_a_script_still_expand():
    env = {"X": "v", "OUT": "/o"}
    assert expand_command("bash -c 'echo \"$1\"' arg0 $X", env) == ["bash", "-c", 'echo "$1"', "arg0", "v"]
    assert expand_command("bash run.sh --out $OUT", env) == ["bash", "run.sh", "--out", "/o"]  # a script file, not text
    assert expand_command("python train.py --shell bash --out $OUT", env)[-1] == "/o"

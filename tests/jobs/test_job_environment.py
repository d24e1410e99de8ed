"""The job's environment as a shell user expects it: `$VAR` expansion in the entrypoint with the job's
own variables, the job's virtualenv first on PATH, the evaluator run with the job's interpreter, and
nothing from the broker's environment written to disk."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app
from trainmaster.jobs.environment import expand_command, interpreter_environment

SECRET = "s3cr3t-only-in-the-broker-shell"
INHERITED = "value-only-in-the-broker-shell"

ARGV_SCRIPT = """
    import json, os, pathlib, sys
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    (out / "seen.json").write_text(json.dumps({"argv": sys.argv[1:], "secret": os.environ.get("SECRET_TOKEN"),
                                               "inherited": os.environ.get("NCCL_SOCKET_IFNAME")}))
"""

# a model file by hand (safetensors: 8-byte header length, JSON header, data), so the job needs no torch
MAKE_MODEL = """
import json, os, pathlib, struct, sys
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
(out / "trained_with.txt").write_text(sys.executable)
"""

EVALUATE = """
import json, os, pathlib, sys
pathlib.Path(os.environ["EVALUATED_WITH"]).write_text(json.dumps({
    "python": sys.executable, "venv": os.environ.get("VIRTUAL_ENV"), "epochs": os.environ.get("EPOCHS")}))
print(json.dumps({"score": 1.0}))
"""


def cli(*args: str):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result


def only_job() -> str:
    [job_dir] = (paths.home() / "jobs").iterdir()
    return job_dir.name


def test_entrypoint_words_expand_with_the_jobs_environment(tm_home, job_factory, monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", SECRET)  # in the broker's environment only: never the job's
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", INHERITED)  # on the allowlist (jobs/inherited.py): the job's too
    entrypoint = 'python train.py --out $TRAINMASTER_OUTPUT_DIR/x --epochs ${EPOCHS} --home "$HOME" --left $NOT_SET_ANYWHERE'
    spec = job_factory(ARGV_SCRIPT, 'env:\n  EPOCHS: "3"\n', entrypoint=entrypoint)
    result = cli("submit", spec, "--wait")
    assert result.exit_code == 0, result.output
    job_id = only_job()
    attempt = paths.attempt_dir(job_id, 1)
    seen = json.loads((paths.job_dir(job_id) / "outputs" / "seen.json").read_text())
    assert seen["argv"] == ["--out", f"{attempt}/outputs/x", "--epochs", "3", "--home", os.environ["HOME"],
                            "--left", "$NOT_SET_ANYWHERE"]
    assert seen["secret"] is None  # a secret of the broker's never reaches the job …
    assert seen["inherited"] == INHERITED  # … what the allowlist lets through does, at run time …
    launch = json.loads((attempt / "launch.json").read_text())
    assert "SECRET_TOKEN" not in launch["env"] and "HOME" not in launch["env"] and "PATH" not in launch["env"]
    assert "NCCL_SOCKET_IFNAME" not in launch["env"]
    assert set(launch["env"]) - {"EPOCHS", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                 "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT"} == {
        k for k in launch["env"] if k.startswith("TRAINMASTER_")}
    for path in attempt.rglob("*"):  # … but is never written to disk: not in launch.json, not in the log
        if path.is_file() and "outputs" not in path.parts:
            assert SECRET.encode() not in path.read_bytes() and INHERITED.encode() not in path.read_bytes(), path
    assert "$ python train.py --out $TRAINMASTER_OUTPUT_DIR/x" in (attempt / "job.log").read_text()


def test_bash_entrypoint_finds_the_jobs_python_first_on_path(tm_home, job_factory):
    entrypoint = "bash -c 'which python > $TRAINMASTER_OUTPUT_DIR/which.txt'"
    spec = job_factory("", entrypoint=entrypoint)
    result = cli("submit", spec, "--wait")
    assert result.exit_code == 0, result.output
    which = (paths.job_dir(only_job()) / "outputs" / "which.txt").read_text().strip()
    assert which == str(Path(sys.executable).parent / "python")  # the broker's interpreter (`python: current`)


@pytest.mark.slow
def test_requirements_virtualenv_runs_the_job_its_shell_and_its_evaluator(tm_home, job_factory, monkeypatch, tmp_path):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # the requirement is already in the base environment: no network
    entrypoint = ("bash -c 'for tool in python pip torchrun; do which $tool; done > $TRAINMASTER_OUTPUT_DIR/which.txt"
                  " && echo $VIRTUAL_ENV > $TRAINMASTER_OUTPUT_DIR/venv.txt && python make_model.py'")
    evaluated_with = tmp_path / "evaluated_with.json"
    spec = job_factory("", f"environment:\n  python: requirements\nenv:\n  EPOCHS: '2'\n  EVALUATED_WITH: {evaluated_with}\n"
                           "verification:\n  evaluator: python evaluate.py\n", entrypoint=entrypoint)
    (spec.parent / "requirements.txt").write_text("pyyaml\n")
    (spec.parent / "make_model.py").write_text(MAKE_MODEL)
    (spec.parent / "evaluate.py").write_text(EVALUATE)
    result = cli("submit", spec, "--wait")
    assert result.exit_code == 0, result.output
    job_id = only_job()
    outputs = paths.job_dir(job_id) / "outputs"
    venv = Path((outputs / "venv.txt").read_text().strip())
    assert venv.parent == paths.home() / "envs" and (venv / "pyvenv.cfg").is_file()
    python, pip, torchrun = (outputs / "which.txt").read_text().split()
    assert (python, pip, torchrun) == (str(venv / "bin" / "python"), str(venv / "bin" / "pip"), str(venv / "bin" / "torchrun"))
    assert str(venv / "bin" / "python") in Path(torchrun).read_text().splitlines()[0]  # a console script runs the venv's python
    assert (outputs / "trained_with.txt").read_text() == python
    evaluated = json.loads(evaluated_with.read_text())  # the broker re-derives the venv from the requirements' hash
    assert evaluated == {"python": python, "venv": str(venv), "epochs": "2"}
    status = json.loads(cli("status", job_id, "--json").output)
    assert status["state"] == "accepted"


def test_expand_command_splits_like_a_shell_then_expands_each_word():
    env = {"OUT": "/runs/a b", "EPOCHS": "3"}
    assert expand_command("python t.py --out $OUT/x --epochs=${EPOCHS} '$EPOCHS' \"n=$EPOCHS\"", env) == [
        "python", "t.py", "--out", "/runs/a b/x", "--epochs=3", "3", "n=3"]  # a value with a space stays one word
    assert expand_command("bash -c 'for i in 1 2; do echo $i $1 ${MISSING}; done'", env) == [
        "bash", "-c", "for i in 1 2; do echo $i $1 ${MISSING}; done"]  # unknown names are left for bash
    assert expand_command("echo $$ $ ${} $EPOCHSX", env) == ["echo", "$$", "$", "${}", "$EPOCHSX"]


def test_interpreter_environment_puts_a_virtualenv_first(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    base = {"PATH": f"/usr/bin:{venv}/bin:/bin", "PYTHONHOME": "/elsewhere", "KEEP": "1"}
    env = interpreter_environment(str(venv / "bin" / "python"), base)
    assert env["PATH"] == f"{venv}/bin:/usr/bin:/bin" and env["VIRTUAL_ENV"] == str(venv)
    assert "PYTHONHOME" not in env and env["KEEP"] == "1"
    assert interpreter_environment("/usr/bin/python3", base) == base  # not a virtualenv: left as is

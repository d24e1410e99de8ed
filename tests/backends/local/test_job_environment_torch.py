"""A job environment keeps the broker's torch: a requirement that needs another torch fails the install up
front, the attempt's reason naming the conflict, the torch kept and what to do, and nothing is replaced."""

from __future__ import annotations

import json
import os
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainmaster.backends.local.venv_cache import conflict_reason, constraints, venv_key, held_versions, is_current
from trainmaster.broker import paths
from trainmaster.broker.cli import app


def wheel(directory: Path, name: str, requires: str) -> Path:
    """A minimal pure-Python wheel of `name` 0.1 that requires `requires` (built by hand: no network, no setuptools)."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"{name}-0.1.dist-info"
    files = {
        f"{name}/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\nRequires-Dist: {requires}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    path = directory / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


@pytest.mark.slow
def test_a_requirement_needing_another_torch_fails_up_front_naming_it(tm_home, job_factory, tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing reaches the network
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # nor does this machine's pip configuration (its constraints)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    wheels = tmp_path / "wheels"
    wheel(wheels, "needs_old_torch", "torch==1.0.0")
    spec = job_factory("print('never runs')\n", "environment:\n  python: requirements\n")
    (spec.parent / "requirements.txt").write_text(f"--no-index\n--find-links {wheels}\nneeds_old_torch\n")
    result = CliRunner().invoke(app, ["submit", str(spec), "--wait", "--json"])
    assert result.exit_code == 1, result.output
    job = json.loads(result.output[result.output.index("{"):])
    [attempt] = job["attempts"]
    torch = version("torch")
    assert attempt["state"] == "failed" and job["state"] == "failed"
    reason = attempt["reason"]
    assert f"conflict with the broker's torch {torch}" in reason, reason
    assert "needs-old-torch 0.1 depends on torch==1.0.0" in reason.lower().replace("_", "-"), reason
    assert "never replaces it" in reason and "install the torch you need into the broker's own environment" in reason
    log = (paths.attempt_dir(job["id"], 1) / "job.log").read_text()
    assert f"keeping the broker's numpy {version('numpy')}, pydantic {version('pydantic')}" in log
    assert "never runs" not in log
    [venv] = [p for p in (paths.home() / "envs").iterdir() if not p.name.startswith(".")]
    assert (venv / "constraints.txt").read_text() == constraints(held_versions())
    assert f"torch=={torch}\n" in (venv / "constraints.txt").read_text()
    assert not (venv / ".ready").exists()  # a failed build is never used


def test_an_environment_built_under_other_held_versions_is_not_current(tmp_path):
    venv = tmp_path / venv_key(b"x\n")
    venv.mkdir()
    (venv / "constraints.txt").write_text("torch==2.0\n")
    assert not is_current(venv, "torch==2.0\n")  # not ready: a build that died half-way
    (venv / ".ready").touch()
    assert is_current(venv, "torch==2.0\n") and not is_current(venv, "torch==2.1\n")
    assert venv_key(b"x\n") != venv_key(b"y\n")


def test_conflict_reason_names_only_held_packages():
    pip = ("ERROR: Cannot install tv==0.1 because these package versions have conflicting dependencies.\n\n"
           "The conflict is caused by:\n    tv 0.1 depends on torch==1.0.0\n"
           "    The user requested (constraint) torch==2.13.0\n")
    reason = conflict_reason(pip, {"torch": "2.13.0"})
    assert reason.startswith("the requirements conflict with the broker's torch 2.13.0: tv 0.1 depends on torch==1.0.0.")
    assert conflict_reason(pip.replace("torch==1.0.0", "requests>=9"), {"torch": "2.13.0"}) is None
    assert conflict_reason("ERROR: No matching distribution found for nothing-here\n", {"torch": "2.13.0"}) is None

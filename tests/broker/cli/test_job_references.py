"""A job reference names a job only on purpose: an empty one is a usage error, prefixes match case by case,
and a code directory that holds (or sits in) trainmaster's home is refused instead of bundled."""

from __future__ import annotations

import json

import pytest
from cli_run import tm

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


@pytest.fixture
def one_job(job_factory, tmp_path):
    home = tmp_path / "home"
    spec = job_factory(TRAIN, name="solo")
    out = tm("submit", str(spec), "--wait", home=home)
    assert out.returncode == 0, out.stdout + out.stderr
    return home, json.loads(tm("ls", "--all", "--json", home=home).stdout)[0]["id"]


@pytest.mark.parametrize("command", [["status"], ["cancel"], ["logs"], ["resume"], ["verify"], ["verify", "show"],
                                     ["verify", "show", "--again"]])
@pytest.mark.parametrize("ref", ["", "  "])
def test_an_empty_reference_is_a_usage_error_even_with_one_job(one_job, command, ref, tmp_path):
    home, job_id = one_job
    out = tm(*command, ref, home=home, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "empty job reference" in out.stderr
    assert json.loads(tm("status", job_id, "--json", home=home).stdout)["state"] == "accepted"  # not cancelled


def test_prefixes_match_case_by_case(one_job):
    home, job_id = one_job
    assert tm("status", job_id[:6], home=home).returncode == 0
    upper = tm("status", job_id[:6].upper(), home=home)
    assert upper.returncode == 2 and "no job" in upper.stderr
    assert tm("cancel", job_id.upper(), home=home).returncode == 2
    assert tm("verify", job_id.upper(), home=home).returncode == 2


@pytest.mark.parametrize("where", ["holds", "is", "inside"])
def test_a_code_dir_overlapping_the_home_is_refused(tmp_path, where):
    project = tmp_path / "project"
    home = {"holds": project / ".tm", "is": project, "inside": project.parent / "h"}[where]
    code = project if where != "inside" else home / "code"
    code.mkdir(parents=True)
    (code / "train.py").write_text(TRAIN)
    (code / "job.yaml").write_text("name: t\nentrypoint: python train.py\n")
    for args in (["--dry-run"], []):
        out = tm("submit", str(code / "job.yaml"), *args, home=home)
        assert out.returncode == 1, out.stdout + out.stderr
        assert "overlaps trainmaster's home" in out.stderr and "job.yaml: code:" in out.stderr
    assert not (home / "bundles").exists() or not list((home / "bundles").iterdir())

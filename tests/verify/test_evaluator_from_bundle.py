"""A job's evaluator runs from a fresh, hash-checked extraction of the bundle the broker sent, with an
interpreter the broker derives — never from the attempt's code directory or from a record the job could
write. Each job here trains honestly to a poor score, then tries to fake its evaluation (through
`trainmaster submit --wait`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

# a model file by hand (safetensors: 8-byte header length, JSON header, data), so the job needs no torch
MAKE_MODEL = """\
import json, os, pathlib, struct
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
FAKE = 'print(\\'{"score": 1.0, "faked": 1}\\')\\n'
"""

CHEATS = {
    "honest": "",
    # rewrite the evaluator in the job's own working directory (the attempt's code dir)
    "evaluator": "pathlib.Path('evaluate.py').write_text(FAKE)\n",
    # rewrite a module the evaluator imports
    "module": "pathlib.Path('scoring.py').write_text('SCORE = 1.0\\n')\n",
    # point the attempt's interpreter record at a fake "python" that prints a perfect score
    "interpreter": (
        "fake = pathlib.Path('..', 'fake-python').resolve()\n"
        "fake.write_text('#!/bin/sh\\necho \\'{\"score\": 1.0, \"faked\": 1}\\'\\n')\n"
        "fake.chmod(0o755)\n"
        "pathlib.Path('..', 'environment.json').write_text(json.dumps({'python': str(fake)}))\n"
    ),
    # rewrite the broker's stored bundle, hoping the evaluator is taken from it unchecked
    "bundle": (
        # the job no longer inherits TRAINMASTER_HOME; it finds the home above its own working directory
        "home = next(p for p in pathlib.Path.cwd().parents if (p / 'bundles').is_dir())\n"
        "tar = home / 'bundles' / (os.environ['TRAINMASTER_BUNDLE_SHA256'] + '.tar')\n"
        "tar.write_bytes(tar.read_bytes().replace(b'0.1', b'1.0'))\n"
    ),
}

EVALUATE = 'import json, scoring\nprint(json.dumps({"score": scoring.SCORE}))\n'
SCORING = "SCORE = 0.1\n"
SPEC = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: {threshold}\n"


def honest_job(job_factory, train: str, threshold: float):
    """A job scoring 0.1 by its evaluator (which imports `scoring.py`) against `threshold`; its spec path."""
    spec = job_factory(train, SPEC.format(threshold=threshold))
    (spec.parent / "evaluate.py").write_text(EVALUATE)
    (spec.parent / "scoring.py").write_text(SCORING)
    return spec


def cli(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def only_job() -> str:
    [job_dir] = (paths.home() / "jobs").iterdir()
    return job_dir.name


@pytest.mark.parametrize("cheat, exit_code, outcome", [
    ("honest", 0, "accepted"), ("evaluator", 1, "rejected"), ("module", 1, "rejected"),
    ("interpreter", 1, "rejected"), ("bundle", 2, "cannot_verify"),
])
def test_a_job_cannot_fake_its_evaluation(tm_home, job_factory, cheat, exit_code, outcome):
    threshold = 0.05 if cheat == "honest" else 0.5  # 0.1 passes the first; only a faked 1.0 would pass 0.5
    spec = honest_job(job_factory, MAKE_MODEL + CHEATS[cheat], threshold)
    result = cli("submit", spec, "--wait")
    assert result.exit_code == exit_code, result.output
    job_id = only_job()
    verdict = json.loads(cli("verify", job_id, "--json").output)
    assert verdict["outcome"] == outcome, verdict
    if outcome == "rejected":
        assert "score = 0.1 is below the threshold 0.5" in verdict["reasons"][0]
    elif outcome == "cannot_verify":
        assert "bundle cannot be extracted for its evaluator" in verdict["reasons"][0]
        assert json.loads(cli("status", job_id, "--json").output)["state"] == "unverified"
    else:
        assert verdict["evidence"]["outcome"]["metrics"] == {"score": 0.1}
    assert "faked" not in json.dumps(verdict)
    assert not any((paths.job_dir(job_id) / "verify").iterdir())  # each fresh extraction is removed after use


def test_once_the_bundle_is_restored_verify_again_runs_the_original_evaluator(tm_home, job_factory):
    from trainmaster.jobs.bundle import build_bundle
    from trainmaster.jobs.spec import load_spec

    spec = honest_job(job_factory, MAKE_MODEL + CHEATS["bundle"], 0.5)
    assert cli("submit", spec, "--wait").exit_code == 2
    job_id = only_job()
    sha256 = json.loads(cli("status", job_id, "--json").output)["bundle_sha256"]
    (paths.bundles_dir() / f"{sha256}.tar").unlink()  # the user rebuilds the bundle the job spoiled
    loaded = load_spec(spec)
    assert build_bundle(loaded.code_dir, loaded.spec.canonical_json(), paths.bundles_dir()).sha256 == sha256
    stale = paths.job_dir(job_id) / "verify" / "code-left-by-a-crash"
    stale.mkdir(parents=True)
    again = cli("verify", job_id, "--again", "--json")
    assert again.exit_code == 1, again.output
    assert "score = 0.1 is below the threshold 0.5" in json.loads(again.output)["reasons"][0]
    assert not any((paths.job_dir(job_id) / "verify").iterdir())


# the pipeline on its own: what it runs the evaluator from


def _model(outputs: Path) -> None:
    import struct

    outputs.mkdir(parents=True)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (outputs / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))


def _attempt(tmp_path: Path, *, python: str = "current", **kw):
    """A trusted attempt of a spec with an evaluator (score 0.1, threshold 0.5), its bundle built, then its
    code dir rewritten to print a faked score; `kw` overrides the Attempt's fields."""
    from trainmaster.jobs.bundle import build_bundle
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.verify.pipeline import Attempt

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    (code / "evaluate.py").write_text(EVALUATE)
    (code / "scoring.py").write_text(SCORING)
    (code / "requirements.txt").write_text(REQUIREMENTS.decode())
    spec = JobSpec(name="t", entrypoint="python train.py", environment={"python": python},
                   verification={"evaluator": "python evaluate.py", "thresholds": {"score": 0.5}})
    info = build_bundle(code, spec.canonical_json(), tmp_path / "bundles")
    (code / "evaluate.py").write_text(f"print({FAKE_LINE!r})\n")  # the code dir, rewritten after bundling
    _model(tmp_path / "outputs")
    fields = dict(job_id="t-1", attempt_id="a1", outputs=tmp_path / "outputs", bundle_sha256=info.sha256, spec=spec,
                  trusted=True, code_dir=code, bundle=info.path, workspace=tmp_path / "verify")
    return Attempt(**{**fields, **kw})


FAKE_LINE = '{"score": 1.0, "faked": 1}'
REQUIREMENTS = b"pyyaml\n"


def test_the_evaluator_runs_from_the_bundle_even_when_a_code_dir_is_given(tmp_path):
    from trainmaster.verify.pipeline import verify_attempt

    verdict = verify_attempt(_attempt(tmp_path), checks={"outcome"}, write_verdict=False)
    assert verdict.outcome == "rejected" and "score = 0.1 is below the threshold 0.5" in verdict.reasons[0]
    assert list((tmp_path / "verify").iterdir()) == []  # the fresh extraction is removed after use


def test_a_bundle_that_is_not_the_jobs_cannot_verify(tmp_path):
    from trainmaster.verify.pipeline import verify_attempt

    verdict = verify_attempt(_attempt(tmp_path, bundle_sha256="0" * 64), checks={"outcome"}, write_verdict=False)
    assert verdict.outcome == "cannot_verify" and "bundle cannot be extracted for its evaluator" in verdict.reasons[0]
    assert list((tmp_path / "verify").iterdir()) == []


def test_the_evaluator_runs_with_the_virtualenv_built_for_the_bundles_requirements(tmp_path):
    from trainmaster.jobs import venvs
    from trainmaster.verify.pipeline import verify_attempt

    envs = tmp_path / "envs"
    python = envs / venvs.venv_key(REQUIREMENTS) / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f"#!/bin/sh\necho '{FAKE_LINE}'\n")  # stands in for the built virtualenv's interpreter
    python.chmod(0o755)
    attempt = _attempt(tmp_path, python="requirements", envs_dir=envs)
    unbuilt = verify_attempt(attempt, checks={"outcome"}, write_verdict=False)
    assert "score = 0.1" in unbuilt.reasons[0]  # none built (no .ready marker): the broker's interpreter
    (python.parent.parent / venvs.READY).touch()
    built = verify_attempt(attempt, checks={"outcome"}, write_verdict=False)
    assert built.accepted and built.evidence["outcome"]["metrics"]["score"] == 1.0

"""A job's evaluator runs from a fresh, hash-checked extraction of the bundle the broker sent, with an
interpreter the broker derives — never from the attempt's code directory or from a record the job could
write. Each job here trains honestly to a poor score, then tries to fake its evaluation (through
`trainmaster submit --wait`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainmaster.broker import paths
from trainmaster.broker.cli import app

# a model file by hand (safetensors: 8-byte header length, JSON header, data), so the job needs no torch
MAKE_MODEL = """\
import json, os, pathlib, struct, stat
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
(out / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
FAKE = 'print(\\'{"score": 1.0, "faked": 1}\\')\\n'
"""

CHEATS = {
    "honest": "",
    # rewrite the evaluator in the job's own working directory (the attempt's code dir)
    "evaluator": "pathlib.Path('evaluate.py').write_text(FAKE)\n",
    # point the attempt's interpreter record at a fake "python" that prints a perfect score
    "interpreter": (
        "fake = pathlib.Path('..', 'fake-python').resolve()\n"
        "fake.write_text('#!/bin/sh\\necho \\'{\"score\": 1.0, \"faked\": 1}\\'\\n')\n"
        "fake.chmod(0o755)\n"
        "pathlib.Path('..', 'environment.json').write_text(json.dumps({'python': str(fake)}))\n"
    ),
    # rewrite the broker's stored bundle, hoping the evaluator is taken from it unchecked
    "bundle": (
        "home = pathlib.Path(os.environ['TRAINMASTER_HOME'])\n"
        "tar = home / 'bundles' / (os.environ['TRAINMASTER_BUNDLE_SHA256'] + '.tar')\n"
        "tar.write_bytes(tar.read_bytes().replace(b'0.1', b'1.0'))\n"
    ),
}

EVALUATE = 'print(\'{"score": 0.1}\')\n'
SPEC = "verification:\n  evaluator: python evaluate.py\n  thresholds:\n    score: 0.05\n"


def cli(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def only_job() -> str:
    [job_dir] = (paths.home() / "jobs").iterdir()
    return job_dir.name


@pytest.mark.parametrize("cheat, exit_code, outcome", [
    ("honest", 0, "accepted"), ("evaluator", 1, "rejected"), ("interpreter", 1, "rejected"),
    ("bundle", 2, "cannot_verify"),
])
def test_a_job_cannot_fake_its_evaluation(tm_home, job_factory, cheat, exit_code, outcome):
    threshold = "0.05" if cheat == "honest" else "0.5"  # 0.1 passes the first; only a faked 1.0 would pass 0.5
    spec = job_factory(MAKE_MODEL + CHEATS[cheat], SPEC.replace("0.05", threshold))
    (spec.parent / "evaluate.py").write_text(EVALUATE)
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

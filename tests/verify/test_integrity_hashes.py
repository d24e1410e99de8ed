"""The integrity check reads each recorded output once: the final weights' hash, checked against the
recorded one, is the one compared with the commitment (large final weights were read twice)."""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import pytest
import torch

from trainmaster.jobs import files
from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.commitment import Commitment
from trainmaster.verify import signing
from trainmaster.verify.pipeline import Attempt, verify_attempt


def outputs_with_final(tmp_path: Path, *, committed: str | None = None) -> tuple[Path, tuple]:
    """Canonical final weights, a commitment to them (or to ``committed``), and every file recorded."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    data = serialize({"w": torch.ones(4)})
    (outputs / "model.safetensors").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    commitment = Commitment(job_id="j", bundle_sha256="ab" * 32, root="cd" * 32, final_sha256=committed or digest, n=1, k=1)
    (outputs / "commitment.json").write_bytes(commitment.canonical_json())
    recorded = tuple(
        (p.name, p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest()) for p in sorted(outputs.iterdir())
    )
    return outputs, recorded


@pytest.fixture
def hashed(monkeypatch) -> Counter:
    """How many times each file is hashed."""
    counts: Counter = Counter()
    real = files.sha256_file

    def counting(path):
        counts[Path(path).name] += 1
        return real(path)

    monkeypatch.setattr(files, "sha256_file", counting)
    monkeypatch.setattr(signing, "sha256_file", counting)
    return counts


@pytest.mark.parametrize("fetched_now", [False, True])
def test_final_weights_are_hashed_at_most_once(tmp_path, hashed, fetched_now):
    outputs, recorded = outputs_with_final(tmp_path)
    attempt = Attempt(job_id="j", attempt_id="a", outputs=outputs, bundle_sha256="ab" * 32, trusted=True,
                      recorded_outputs=recorded, outputs_hashed=fetched_now)
    verdict = verify_attempt(attempt, checks={"integrity"}, write_verdict=False)
    assert verdict.outcome == "accepted", verdict.reasons
    assert hashed["model.safetensors"] == (0 if fetched_now else 1)


def test_recorded_final_weights_that_are_not_the_committed_ones_are_rejected(tmp_path, hashed):
    outputs, recorded = outputs_with_final(tmp_path, committed="ef" * 32)
    attempt = Attempt(job_id="j", attempt_id="a", outputs=outputs, bundle_sha256="ab" * 32, trusted=True,
                      recorded_outputs=recorded, outputs_hashed=True)
    verdict = verify_attempt(attempt, checks={"integrity"}, write_verdict=False)
    assert verdict.outcome == "rejected"
    assert "the commitment's final_sha256 is efefefefefef" in verdict.reasons[0]


def test_final_weights_changed_since_they_were_recorded_are_rejected(tmp_path, hashed):
    outputs, recorded = outputs_with_final(tmp_path)
    (outputs / "model.safetensors").write_bytes(serialize({"w": torch.zeros(4)}))  # same size, other bytes
    attempt = Attempt(job_id="j", attempt_id="a", outputs=outputs, bundle_sha256="ab" * 32, trusted=True,
                      recorded_outputs=recorded)
    verdict = verify_attempt(attempt, checks={"integrity"}, write_verdict=False)
    assert verdict.outcome == "rejected"
    assert "model.safetensors does not match the size and sha256 recorded" in verdict.reasons[0]


def test_final_weights_without_a_record_are_hashed(tmp_path, hashed):
    """`trainmaster verify DIR` records nothing: the final weights are hashed for the commitment."""
    outputs, _ = outputs_with_final(tmp_path, committed="ef" * 32)
    attempt = Attempt(job_id="j", attempt_id="a", outputs=outputs, bundle_sha256="ab" * 32, trusted=True)
    verdict = verify_attempt(attempt, checks={"integrity"}, write_verdict=False)
    assert verdict.outcome == "rejected" and hashed["model.safetensors"] == 1

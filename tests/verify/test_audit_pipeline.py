"""The whole pipeline on a real DQN run: an honest untrusted executor is accepted; crafted openings are rejected.

An honest DQN's S_0 holds ``last_loss = NaN`` (no loss before learning starts); the safety scan
refused it, so every honest DQN run through the pipeline was rejected. Crafted openings sent by a
remote executor crashed the audit into ``cannot_verify``, blaming nobody and losing the evidence.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from trainmaster.jobs.checkpoint import REST, segment_dir, write_segment_bytes
from trainmaster.jobs.commitment import build_commitment, read_commitment
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.jobs.spec import JobSpec
from trainmaster.verify.calibrate import calibrate
from trainmaster.verify.calibration import store_calibration
from trainmaster.verify.openings import LocalOpenings
from trainmaster.verify.pipeline import Attempt, AuditSettings, verify_attempt
from trainmaster.jobs.signing import sign_commitment

pytestmark = pytest.mark.slow

JOB, BUNDLE, SEED, K = "dqn-1", "dd" * 32, 3, 10
OPTIONS = {"steps": 300, "learning_starts": 100, "buffer_size": 200, "batch_size": 16, "hidden": 32}
DQN = get_recipe("dqn")


def spec() -> JobSpec:
    options = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in OPTIONS.items())
    return JobSpec(
        name="dqn", entrypoint=f"python -m trainmaster.jobs.recipes.dqn {options}", seed=SEED,
        checkpoint={"segment_steps": K}, verification={"challenge_segments": 8},
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dqn") / "outputs"
    settings = RuntimeSettings(job_id=JOB, output_dir=out, checkpoint_dir=out / "checkpoints", seed=SEED,
                               segment_steps=K, bundle_sha256=BUNDLE)
    run(DQN, DQN.config(OPTIONS), settings)
    return out


@pytest.fixture(scope="module")
def audit_settings(tmp_path_factory) -> AuditSettings:
    directory = tmp_path_factory.mktemp("calibration")
    store_calibration(calibrate("dqn", OPTIONS, ks=[K], seeds=[0, 1], warmup=150), directory)
    return AuditSettings(calibration_dir=directory)


@pytest.fixture(scope="module")
def miner():
    from bittensor.sp_core import Keypair

    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic())


def attempt(outputs: Path, miner, **fields) -> Attempt:
    signature = sign_commitment(read_commitment(outputs / "commitment.json"), miner)
    return Attempt(job_id=JOB, attempt_id="a1", outputs=outputs, bundle_sha256=BUNDLE, spec=spec(), trusted=False,
                   hotkey=miner.ss58_address, signature=signature, **fields)


def test_an_honest_dqn_run_is_accepted(trained, miner, audit_settings, tmp_path):
    outputs = Path(shutil.copytree(trained, tmp_path / "job" / "outputs"))
    verdict = verify_attempt(attempt(outputs, miner), db_path=tmp_path / "state.db", audit_settings=audit_settings)
    assert verdict.outcome == "accepted", verdict.reasons
    replay = verdict.evidence["replay"]
    assert len(replay["segments"]) == 10 and all(s["passed"] for s in replay["segments"])  # q = 8, first and last
    assert all(s["exact_compared"] > 0 and s["exact_mismatches"] == [] for s in replay["segments"])
    rest = "checkpoints/segments/00000000/rest.safetensors"
    assert rest in verdict.evidence["safety"]["safetensors_checked"]  # S_0 with its last_loss = NaN


def test_crafted_openings_are_rejected_with_the_evidence(trained, miner, audit_settings, tmp_path):
    """The executor opens (and committed) S_i's rest with a shape of Infinity: rejected, not cannot_verify."""
    outputs = Path(shutil.copytree(trained, tmp_path / "job" / "outputs"))
    sent = Path(shutil.copytree(outputs / "checkpoints", tmp_path / "sent"))  # what the executor sends over the wire
    shutil.rmtree(outputs / "checkpoints")
    n = read_commitment(outputs / "commitment.json").n
    for i in range(1, n - 1):  # whichever segments are drawn, S_i's rest is the crafted one
        here = segment_dir(sent, i)
        files = [(here / name).read_bytes() for name in ("weights.safetensors", REST, "decisions.safetensors")]
        files[1] = _with_infinite_shape(files[1])
        write_segment_bytes(sent, i, *([f] for f in files), job_id=JOB, recipe="dqn", step=i * K, k=K)
    commitment = build_commitment(sent, job_id=JOB, bundle_sha256=BUNDLE, n=n, k=K)
    (outputs / "commitment.json").write_bytes(commitment.canonical_json())
    verdict = verify_attempt(
        attempt(outputs, miner, openings=LocalOpenings(sent)), db_path=tmp_path / "state.db", audit_settings=audit_settings
    )
    assert verdict.outcome == "rejected", verdict.reasons
    assert "rest is not a canonical safetensors file" in verdict.reasons[0] and "Infinity" in verdict.reasons[0]
    crafted = [s for s in verdict.evidence["replay"]["segments"] if not s["passed"]]
    assert crafted and all(s["hashes"]["rest_sha256"] for s in crafted)


def _with_infinite_shape(rest: bytes) -> bytes:
    """A rest file whose header gives its first entry the shape [Infinity] (spaces keep the length)."""
    (length,) = struct.unpack_from("<Q", rest)
    header = rest[8 : 8 + length].decode()
    start = header.index('"shape":[', header.index('"data_offsets"')) + len('"shape":[')
    end = header.index("]", start)
    crafted = header[:start] + "Infinity" + header[end:]
    crafted += " " * (-len(crafted) % 8)
    return struct.pack("<Q", len(crafted)) + crafted.encode() + rest[8 + length :]

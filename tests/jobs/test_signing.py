"""Commitment signatures with real sr25519 hotkeys, Merkle proofs of leaves, and the final weights hash."""

from __future__ import annotations

import hashlib

import pytest
import torch
from bittensor.sp_core import Keypair

from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.merkle import inclusion_proof, merkle_root
from trainmaster.verify.errors import VerificationError
from trainmaster.jobs.signing import sign_commitment
from trainmaster.verify.signing import check_final, check_leaf, verify_commitment

JOB, BUNDLE, K, N = "job-1", "cc" * 32, 25, 8


def new_key():
    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic())


@pytest.fixture(scope="module")
def miner():
    return new_key()


@pytest.fixture(scope="module")
def leaves():
    return [hashlib.sha256(f"state {i}".encode()).digest() for i in range(N + 1)]


@pytest.fixture(scope="module")
def commitment(leaves):
    return Commitment(job_id=JOB, bundle_sha256=BUNDLE, root=merkle_root(leaves).hex(), final_sha256="bb" * 32, n=N, k=K)


def check(commitment, signature, hotkey, **overrides):
    expected = {"expected_job_id": JOB, "expected_bundle_sha256": BUNDLE, "expected_k": K, "expected_n": N, **overrides}
    verify_commitment(commitment, signature, hotkey, **expected)


def reason(commitment, signature, hotkey, **overrides) -> str:
    with pytest.raises(VerificationError) as caught:
        check(commitment, signature, hotkey, **overrides)
    assert caught.value.kind == "rejected"
    return caught.value.reason


def test_signature_format_and_round_trip(miner, commitment):
    signature = sign_commitment(commitment, miner)
    assert signature.startswith("0x") and len(signature) == 130 and signature == signature.lower()
    check(commitment, signature, miner.ss58_address)


def test_wrong_signer_is_rejected(miner, commitment):
    other = new_key()
    signature = sign_commitment(commitment, other)
    check(commitment, signature, other.ss58_address)  # valid — for the other hotkey
    assert "not valid for the dispatched hotkey" in reason(commitment, signature, miner.ss58_address)


@pytest.mark.parametrize(
    "field, value",
    [("root", "00" * 32), ("final_sha256", "00" * 32), ("bundle_sha256", "dd" * 32), ("n", N + 1), ("k", K + 1), ("job_id", "job-2")],
)
def test_tampered_field_is_rejected(miner, commitment, field, value):
    signature = sign_commitment(commitment, miner)
    tampered = commitment.model_copy(update={field: value})
    assert "not valid for the dispatched hotkey" in reason(tampered, signature, miner.ss58_address)


def test_root_from_another_job_is_rejected(miner, leaves):
    other_job = Commitment(job_id="job-0", bundle_sha256=BUNDLE, root=merkle_root(leaves).hex(), final_sha256="bb" * 32, n=N, k=K)
    signature = sign_commitment(other_job, miner)  # honestly signed, but for another job
    assert "for job 'job-0', not 'job-1'" in reason(other_job, signature, miner.ss58_address)


def test_other_bundle_is_rejected(miner, commitment):
    signature = sign_commitment(commitment, miner)
    assert "not the dispatched" in reason(commitment, signature, miner.ss58_address, expected_bundle_sha256="ee" * 32)


def test_n_not_t_over_k_is_rejected(miner, commitment):
    signature = sign_commitment(commitment, miner)
    assert f"n = {N} segments, the spec's T/k is 10" in reason(commitment, signature, miner.ss58_address, expected_n=10)


def test_k_other_than_spec_is_rejected(miner, commitment):
    signature = sign_commitment(commitment, miner)
    assert f"k = {K}, the spec says 50" in reason(commitment, signature, miner.ss58_address, expected_k=50)


@pytest.mark.parametrize("signature", [None, "", "0x1234", "ab" * 64, "0x" + "AB" * 64, "0x" + "zz" * 64])
def test_missing_or_malformed_signature_is_rejected(miner, commitment, signature):
    text = reason(commitment, signature, miner.ss58_address)
    assert "not signed" in text or "malformed" in text


def test_undecodable_hotkey_is_rejected(miner, commitment):
    assert "cannot check the signature" in reason(commitment, sign_commitment(commitment, miner), "not-an-address")


def test_every_leaf_proof_verifies_and_only_at_its_own_index(commitment, leaves):
    accepted = []
    for index, leaf in enumerate(leaves):
        proof = [h.hex() for h in inclusion_proof(leaves, index)]
        check_leaf(commitment, index, leaf.hex(), proof)  # raises if the proof does not reach the root
        accepted.append(index)
        other = (index + 1) % len(leaves)
        with pytest.raises(VerificationError):
            check_leaf(commitment, other, leaf.hex(), proof)
    assert accepted == list(range(commitment.n + 1))


def test_proof_that_misses_the_root_is_rejected(commitment, leaves):
    proof = [h.hex() for h in inclusion_proof(leaves, 3)]
    with pytest.raises(VerificationError, match="does not lead to the committed root"):
        check_leaf(commitment, 3, hashlib.sha256(b"forged").hexdigest(), proof)
    with pytest.raises(VerificationError, match="does not lead to the committed root"):
        check_leaf(commitment, 4, leaves[3].hex(), proof)  # right leaf, wrong position
    with pytest.raises(VerificationError, match="does not lead to the committed root"):
        check_leaf(commitment, 3, leaves[3].hex(), proof[:-1])  # truncated path
    with pytest.raises(VerificationError, match="outside the committed tree"):
        check_leaf(commitment, N + 1, leaves[3].hex(), proof)
    with pytest.raises(VerificationError, match="not 64 lowercase hex"):
        check_leaf(commitment, 3, leaves[3].hex(), ["xyz"])


def test_final_weights_must_hash_to_final_sha256(tmp_path, commitment):
    weights = {"layer.weight": torch.randn(4, 3), "layer.bias": torch.zeros(4)}
    path = tmp_path / "model.safetensors"
    path.write_bytes(serialize(weights))
    good = commitment.model_copy(update={"final_sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    check_final(good, path)
    with pytest.raises(VerificationError, match="final_sha256"):
        check_final(commitment, path)
    weights["layer.bias"][0] = 1.0
    path.write_bytes(serialize(weights))
    with pytest.raises(VerificationError, match="final_sha256"):
        check_final(good, path)


def test_final_weights_must_be_canonical(tmp_path, commitment):
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file({"layer.weight": torch.randn(4, 3)}, str(path))  # valid safetensors, not our canonical form
    committed = commitment.model_copy(update={"final_sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    with pytest.raises(VerificationError, match="not in the canonical serialization"):
        check_final(committed, path)

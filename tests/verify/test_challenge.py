"""The challenge: a function of (secret, root) alone, drawn only from a stored commitment, catching at the rate of docs/protocol.md §9."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.merkle import merkle_root
from trainmaster.verify.challenge import (
    Challenge,
    challenge_seed,
    detection_probability,
    draw_segments,
)
from trainmaster.verify.challenge_secret import new_secret, secret_digest
from trainmaster.verify.commitments import CommitmentStore, StoredCommitment
from trainmaster.verify.errors import VerificationError
from trainmaster.jobs.signing import sign_commitment

secrets_ = st.binary(min_size=16, max_size=64)
roots = st.binary(min_size=32, max_size=32).map(bytes.hex)


def h(label: str) -> bytes:
    return hashlib.sha256(label.encode()).digest()


# the draw


@settings(max_examples=300, deadline=None)
@given(secret=secrets_, root=roots, n=st.integers(0, 400), q=st.integers(0, 40))
def test_draw_shape(secret, root, n, q):
    segments = draw_segments(secret, root, n, q)
    assert segments == draw_segments(secret, root, n, q)  # deterministic
    assert segments == sorted(set(segments))
    assert all(0 <= s < n for s in segments)
    if n:
        assert segments[0] == 0 and segments[-1] == n - 1
    interior = [s for s in segments if 0 < s < n - 1]
    assert len(interior) == min(q, max(n - 2, 0))


@settings(max_examples=200, deadline=None)
@given(secret=secrets_, other_secret=secrets_, root=roots, other_root=roots)
def test_changing_secret_or_root_changes_the_challenge(secret, other_secret, root, other_root):
    n, q = 200, 8  # C(198, 8) ≈ 1.4e13 possible draws: a collision is negligible
    draw = draw_segments(secret, root, n, q)
    if other_secret != secret:
        assert challenge_seed(other_secret, root) != challenge_seed(secret, root)
        assert draw_segments(other_secret, root, n, q) != draw
    if other_root != root:
        assert challenge_seed(secret, other_root) != challenge_seed(secret, root)
        assert draw_segments(secret, other_root, n, q) != draw


@settings(max_examples=100, deadline=None)
@given(secret=secrets_, leaves=st.lists(st.binary(min_size=32, max_size=32), min_size=3, max_size=64), data=st.data())
def test_changing_any_committed_state_changes_the_challenge(secret, leaves, data):
    index = data.draw(st.integers(0, len(leaves) - 1))
    changed = data.draw(st.binary(min_size=32, max_size=32).filter(lambda b: b != leaves[index]))
    other = leaves[:index] + [changed] + leaves[index + 1 :]
    root, other_root = merkle_root(leaves).hex(), merkle_root(other).hex()
    assert root != other_root
    assert challenge_seed(secret, root) != challenge_seed(secret, other_root)
    assert draw_segments(secret, root, 200, 8) != draw_segments(secret, other_root, 200, 8)


def test_all_interior_segments_when_q_covers_them():
    assert draw_segments(h("s"), h("r").hex(), 6, 10) == [0, 1, 2, 3, 4, 5]
    assert draw_segments(h("s"), h("r").hex(), 2, 8) == [0, 1]
    assert draw_segments(h("s"), h("r").hex(), 1, 8) == [0]
    assert draw_segments(h("s"), h("r").hex(), 0, 8) == []


def reference_draw(secret: bytes, root_hex: str, n: int, q: int) -> list[int]:
    """The derivation as docs/verification.md states it, written independently of the module."""
    import hmac

    seed = hmac.new(secret, bytes.fromhex(root_hex), "sha256").digest()
    stream = b"".join(hmac.new(seed, b"trainmaster-challenge-v1" + j.to_bytes(8, "big"), "sha256").digest() for j in range(64))
    words = iter(int.from_bytes(stream[i : i + 8], "big") for i in range(0, len(stream), 8))

    def below(bound):
        return next(x for x in words if x < 2**64 - 2**64 % bound) % bound

    pool = list(range(1, n - 1))
    for i in range(min(q, len(pool))):
        j = i + below(len(pool) - i)
        pool[i], pool[j] = pool[j], pool[i]
    return sorted({0, n - 1} | set(pool[: min(q, len(pool))]))


@settings(max_examples=50, deadline=None)
@given(secret=secrets_, root=roots, n=st.integers(3, 300), q=st.integers(0, 16))
def test_draw_follows_the_documented_derivation(secret, root, n, q):
    assert draw_segments(secret, root, n, q) == reference_draw(secret, root, n, q)


def test_pinned_draw():
    """Pinned: a change here breaks every executor's check of its challenge after the reveal."""
    assert draw_segments(b"\x01" * 32, "ab" * 32, 200, 8) == [0, 8, 38, 54, 155, 159, 172, 179, 198, 199]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="64 lowercase hex"):
        challenge_seed(h("s"), "AB" * 32)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        challenge_seed(b"short", "ab" * 32)
    with pytest.raises(ValueError):
        draw_segments(h("s"), "ab" * 32, -1, 8)


def test_secrets():
    a, b = new_secret(), new_secret()
    assert len(a) == 32 and a != b
    assert secret_digest(a) == hashlib.sha256(a).hexdigest()


def test_interior_segments_are_drawn_uniformly():
    """Chi-square over 198 interior segments: a picker biased to any position (e.g. by update size) fails."""
    n, q, draws = 200, 8, 3000
    counts = [0] * n
    for i in range(draws):
        for s in draw_segments(h(f"u{i}"), h(f"root{i}").hex(), n, q)[1:-1]:
            counts[s] += 1
    expected = draws * q / (n - 2)
    chi2 = sum((c - expected) ** 2 / expected for c in counts[1:-1])
    assert chi2 < _chi2_quantile(n - 3, 0.999), chi2


# detection probability


@pytest.mark.parametrize(
    "q, row",
    [(4, [0.040, 0.187, 0.346, 0.687, 0.939]), (8, [0.079, 0.342, 0.576, 0.905, 0.997]),
     (16, [0.154, 0.574, 0.827, 0.992, 1.000]), (32, [0.295, 0.833, 0.975, 1.000, 1.000])],
)
def test_detection_probability_matches_the_notes_table(q, row):
    for p, value in zip([0.01, 0.05, 0.10, 0.25, 0.50], row):
        assert detection_probability(200, round(p * 200), q) == pytest.approx(value, abs=0.0006)


def test_detection_probability_edges():
    assert detection_probability(200, 0, 8) == 0.0
    assert detection_probability(200, 200, 8) == 1.0
    assert detection_probability(10, 1, 8, include_ends=True) == 1.0  # every segment is audited
    assert detection_probability(200, 1, 8, include_ends=True) == pytest.approx(10 / 200)


# catch rate (docs/protocol.md §9): empirical rate inside the binomial 99 % interval of the formula

N_SEGMENTS, Q, AUDITS = 200, 8, 1000


def _binomial_interval(trials: int, p: float, level: float = 0.99) -> tuple[int, int]:
    """The central ``level`` interval of Binomial(trials, p): lowest k with CDF ≥ α/2, lowest with CDF ≥ 1 − α/2."""
    tail = (1 - level) / 2
    cdf, lo = 0.0, None
    for k in range(trials + 1):
        cdf += math.exp(
            math.lgamma(trials + 1) - math.lgamma(k + 1) - math.lgamma(trials - k + 1)
            + (k * math.log(p) if k else 0.0) + ((trials - k) * math.log1p(-p) if trials - k else 0.0)
        )
        if lo is None and cdf >= tail:
            lo = k
        if cdf >= 1 - tail:
            return lo, k
    return lo, trials


def _chi2_quantile(df: int, level: float) -> float:
    """Wilson–Hilferty approximation of the chi-square quantile."""
    z = {0.999: 3.0902}[level]
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("p", [0.05, 0.10, 0.25])
def test_catch_rate_against_a_fixed_cheater(p):
    """The cheater fakes the interior segments a front-biased picker would miss; each audit has its own secret and root."""
    faked = set(range(N_SEGMENTS - 1 - round(p * N_SEGMENTS), N_SEGMENTS - 1))
    caught = sum(
        bool(faked.intersection(draw_segments(h(f"fixed{p}/{i}"), h(f"root{p}/{i}").hex(), N_SEGMENTS, Q)))
        for i in range(AUDITS)
    )
    lo, hi = _binomial_interval(AUDITS, detection_probability(N_SEGMENTS - 2, len(faked), Q))
    assert lo <= caught <= hi, (caught, lo, hi)


@pytest.mark.parametrize("p", [0.05, 0.10, 0.25])
def test_catch_rate_of_the_whole_audit(p):
    """Faked segments anywhere (first and last included); the audit is q random segments plus first and last."""
    rng = random.Random(f"placement {p}")
    faked_count = round(p * N_SEGMENTS)
    caught = 0
    for i in range(AUDITS):
        faked = set(rng.sample(range(N_SEGMENTS), faked_count))
        caught += bool(faked.intersection(draw_segments(h(f"whole{p}/{i}"), h(f"r{p}/{i}").hex(), N_SEGMENTS, Q)))
    lo, hi = _binomial_interval(AUDITS, detection_probability(N_SEGMENTS, faked_count, Q, include_ends=True))
    assert lo <= caught <= hi, (caught, lo, hi)


# a challenge only for a verified, stored commitment

JOB, BUNDLE = "job-1", "cc" * 32


@pytest.fixture
def miner():
    from bittensor.sp_core import Keypair

    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic())


@pytest.fixture
def commitment():
    return Commitment(job_id=JOB, bundle_sha256=BUNDLE, root=h("root").hex(), final_sha256="bb" * 32, n=40, k=25)


@pytest.fixture
def store(tmp_path):
    s = CommitmentStore(tmp_path / "state.db")
    yield s
    s.close()


def stored_for(store, commitment, miner, signature=None):
    return store.store(
        commitment, attempt_id="a1", signature=signature or sign_commitment(commitment, miner), hotkey=miner.ss58_address,
        expected_job_id=JOB, expected_bundle_sha256=BUNDLE, expected_k=25, expected_n=40,
    )


def test_challenge_for_a_stored_commitment(store, commitment, miner):
    secret = new_secret()
    stored = stored_for(store, commitment, miner)
    challenge = Challenge.for_commitment(stored, secret, q=8)
    assert list(challenge.segments) == draw_segments(secret, commitment.root, 40, 8)
    assert challenge.message() == {"job_id": JOB, "root": commitment.root, "segments": list(challenge.segments)}
    assert set(challenge.leaves) == {j for i in challenge.segments for j in (i, i + 1)}
    assert store.get(JOB, "a1") == stored  # it is in the database before anyone can draw


def test_no_challenge_without_a_stored_commitment(commitment):
    with pytest.raises(TypeError, match="only for a StoredCommitment"):
        Challenge.for_commitment(commitment, new_secret(), q=8)
    with pytest.raises(TypeError, match="made only by CommitmentStore"):
        StoredCommitment(JOB, "a1", commitment, "0x" + "00" * 64, "hotkey", 0.0)


def test_a_stored_commitment_cannot_be_copied_into_another(store, commitment, miner):
    stored = stored_for(store, commitment, miner)
    with pytest.raises(TypeError, match="made only by CommitmentStore"):
        dataclasses.replace(stored, commitment=commitment.model_copy(update={"root": "00" * 32}))


def test_bad_signature_stores_nothing(store, commitment, miner):
    forged = sign_commitment(commitment.model_copy(update={"root": "00" * 32}), miner)
    with pytest.raises(VerificationError, match="not valid for the dispatched hotkey"):
        stored_for(store, commitment, miner, signature=forged)
    assert store.get(JOB, "a1") is None


def test_a_second_different_commitment_is_equivocation(store, commitment, miner):
    first = stored_for(store, commitment, miner)
    assert stored_for(store, commitment, miner).commitment == first.commitment  # same one again: idempotent
    with pytest.raises(VerificationError, match="equivocation"):
        stored_for(store, commitment.model_copy(update={"root": "00" * 32}), miner)


def test_a_tampered_database_row_is_caught(store, commitment, miner):
    stored_for(store, commitment, miner)
    other = commitment.model_copy(update={"root": "00" * 32}).canonical_json().decode()
    store.database.db.execute("UPDATE commitments SET commitment_json = ?", (other,))
    with pytest.raises(VerificationError, match="not valid for the dispatched hotkey"):
        store.get(JOB, "a1")


def test_trusted_commitments_are_stored_with_their_fields_checked(store, commitment):
    stored = store.store_trusted(
        commitment, attempt_id="a1", expected_job_id=JOB, expected_bundle_sha256=BUNDLE, expected_k=25, expected_n=40
    )
    assert not stored.signed
    with pytest.raises(VerificationError, match="T/k is 41"):
        store.store_trusted(
            commitment, attempt_id="a2", expected_job_id=JOB, expected_bundle_sha256=BUNDLE, expected_k=25, expected_n=41
        )


def test_the_last_l_segments_are_always_drawn_and_the_random_ones_lie_before_them():
    from trainmaster.verify.challenge import draw_segments

    for root in ("ab" * 32, "cd" * 32, "01" * 32):
        drawn = draw_segments(b"s" * 32, root, 40, 8, tail=5)
        assert drawn[0] == 0 and drawn[-5:] == [35, 36, 37, 38, 39]
        assert len(drawn) == 1 + 8 + 5  # the q random draws come from 1..34, never the tail
    assert draw_segments(b"s" * 32, "ab" * 32, 40, 8) == draw_segments(b"s" * 32, "ab" * 32, 40, 8, tail=1)

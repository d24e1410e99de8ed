"""RFC 6962 Merkle tree: the Certificate Transparency reference vectors, and proofs of every leaf."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmaster.jobs.merkle import inclusion_proof, leaf_hash, merkle_root, node_hash, verify_inclusion

# The CT reference inputs and tree heads for sizes 0..8 (certificate-transparency merkle_tree_test).
LEAVES = [bytes.fromhex(h) for h in ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"]]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
PROOFS = [  # (index, size, path)
    (0, 1, []),
    (0, 8, ["96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"]),
    (5, 8, ["bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"]),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (1, 5, ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"]),
]


def test_prefixes_separate_leaves_from_nodes():
    assert leaf_hash(b"abc") == hashlib.sha256(b"\x00abc").digest()
    left, right = leaf_hash(b"a"), leaf_hash(b"b")
    assert node_hash(left, right) == hashlib.sha256(b"\x01" + left + right).digest()
    assert leaf_hash(left + right) != node_hash(left, right)


@pytest.mark.parametrize("size", range(9))
def test_roots_match_the_reference_vectors(size):
    assert merkle_root(LEAVES[:size]).hex() == ROOTS[size]


@pytest.mark.parametrize("index, size, path", PROOFS)
def test_proofs_match_the_reference_vectors_and_verify(index, size, path):
    proof = inclusion_proof(LEAVES[:size], index)
    assert [h.hex() for h in proof] == path
    assert verify_inclusion(LEAVES[index], index, size, proof, bytes.fromhex(ROOTS[size]))


def test_verification_refuses_wrong_leaf_index_root_and_proof_length():
    root, proof = bytes.fromhex(ROOTS[8]), inclusion_proof(LEAVES, 5)
    assert not verify_inclusion(LEAVES[4], 5, 8, proof, root)
    assert not verify_inclusion(LEAVES[5], 4, 8, proof, root)
    assert not verify_inclusion(LEAVES[5], 8, 8, proof, root)
    assert not verify_inclusion(LEAVES[5], 5, 8, proof, bytes.fromhex(ROOTS[7]))
    assert not verify_inclusion(LEAVES[5], 5, 8, proof[:-1], root)
    assert not verify_inclusion(LEAVES[5], 5, 8, [*proof, root], root)
    with pytest.raises(IndexError):
        inclusion_proof(LEAVES, 8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(min_size=32, max_size=32), min_size=1, max_size=70), st.data())
def test_every_leaf_proves_and_any_flipped_bit_fails(leaves, data):
    root = merkle_root(leaves)
    index = data.draw(st.integers(0, len(leaves) - 1))
    proof = inclusion_proof(leaves, index)
    assert verify_inclusion(leaves[index], index, len(leaves), proof, root)
    if proof:
        which = data.draw(st.integers(0, len(proof) - 1))
        bit = data.draw(st.integers(0, 255))
        flipped = bytearray(proof[which])
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert not verify_inclusion(leaves[index], index, len(leaves), [*proof[:which], bytes(flipped), *proof[which + 1 :]], root)
    changed = bytes([leaves[index][0] ^ 1]) + leaves[index][1:]
    assert not verify_inclusion(changed, index, len(leaves), proof, root)

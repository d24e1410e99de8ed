"""Executor bytes never crash the auditor: crafted openings are rejections, with the evidence kept.

Each crafted file is committed (its bytes are what the executor's leaf hashes), so it passes the
root check and reaches the parser or the recipe's loading code; oversized ones are refused before
they are parsed. Before, these crashed the audit (a ``cannot_verify`` nobody is blamed for) or were
accepted with a 6–9× memory amplification.
"""

from __future__ import annotations

import json
import struct
import tracemalloc

import pytest
import torch

from trainmaster.jobs.canonical import CanonicalError, deserialize, header_bytes, serialize
from trainmaster.jobs.checkpoint import REST
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.state import MAX_JSON_DEPTH, TrainState, json_tensor, tensor_json
from trainmaster.verify.audit import run_audit
from trainmaster.verify.openings import LocalOpenings

from audit_support import TINY_LM, Run, commit, commit_files, train

K = 10
SEED = 5
LM = get_recipe("tiny-lm")
TAU = 6e-3
J = 2
"""The crafted segment: its S_J is the executor's bytes."""


@pytest.fixture(scope="module")
def honest() -> Run:
    return train(LM, TINY_LM, SEED, K)


def audit_segment(run: Run, root, crafted: bytes | None = None):
    """Commit ``run`` (S_J's rest file replaced by ``crafted`` bytes, if given) and audit segment J."""
    commitment = commit_files(run, root, {(J, REST): crafted}) if crafted is not None else commit(run, root)
    report = run_audit(
        commitment=commitment, openings=LocalOpenings(root), segments=[J], recipe="tiny-lm", config=TINY_LM,
        seed=SEED, tau=TAU,
    )
    assert not report.passed and report.segments[0].hashes is not None  # rejected, and what was opened is on record
    return report.segments[0].reasons[0]


def with_rest(run: Run, entries: dict[str, torch.Tensor]) -> Run:
    """``run`` whose S_J's rest holds ``entries`` too (replacing any of the same name)."""
    states = list(run.states)
    states[J] = TrainState(weights=states[J].weights, rest={**states[J].rest, **entries})
    return Run(run.recipe, run.seed, run.k, states, run.traces)


def rest_with_header_entry(run: Run, shape_text: str) -> bytes:
    """S_J's canonical rest file plus one entry whose shape is ``shape_text``, written as raw JSON."""
    tensors = dict(sorted(run.states[J].rest.items()))
    data_end = sum(t.numel() * t.element_size() for t in tensors.values())
    header = json.loads(header_bytes(tensors)[8:])
    header["zz"] = {"data_offsets": [data_end, data_end + 16], "dtype": "F32", "shape": "SHAPE"}
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).replace('"SHAPE"', shape_text).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + serialize(tensors)[len(header_bytes(tensors)) :] + bytes(16)


def test_a_float_recipe_json_is_refused(honest, tmp_path):
    reason = audit_segment(with_rest(honest, {"runtime/recipe.json": torch.tensor([1.5])}), tmp_path)
    assert reason.startswith("S_2: state lacks the runtime's entries: a JSON entry must be a 1-D uint8 tensor")


def test_a_deeply_nested_json_entry_is_refused_before_parsing(honest, tmp_path):
    deep = torch.frombuffer(bytearray(b"[" * 1000 + b"]" * 1000), dtype=torch.uint8)
    reason = audit_segment(with_rest(honest, {"runtime/config.json": deep}), tmp_path / "deep")
    assert f"nests 1000 levels deep, more than {MAX_JSON_DEPTH}" in reason
    deeper = torch.frombuffer(bytearray(b"[" * 100_000 + b"]" * 100_000), dtype=torch.uint8)
    reason = audit_segment(with_rest(honest, {"runtime/config.json": deeper}), tmp_path / "deeper")
    assert "refused unparsed" in reason


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        ("[Infinity]", "Infinity is not a JSON number"),
        ("[1e400]", "not a list of non-negative integers"),
        ("[4611686018427387904, 4]", "offsets that do not match its shape"),
        ("[-4]", "not a list of non-negative integers"),
        ("[[[4]]]", "nests"),
    ],
)
def test_crafted_shapes_are_refused(shape, why, honest, tmp_path):
    reason = audit_segment(honest, tmp_path, rest_with_header_entry(honest, shape))
    assert reason.startswith("S_2 rest is not a canonical safetensors file") and why in reason


def test_an_extra_unused_entry_is_refused(honest, tmp_path):
    small = audit_segment(with_rest(honest, {"junk": torch.zeros(4)}), tmp_path / "small")
    assert "not what the spec's trainer loads from them: junk: unexpected entry" in small
    large = audit_segment(with_rest(honest, {"junk": torch.zeros(256 * 1024)}), tmp_path / "large")  # 1 MiB: over the layout's cap
    assert "the rest of S_2 is" in large and "refused unparsed" in large


def test_padding_is_refused(honest, tmp_path):
    canonical = serialize(honest.states[J].rest)
    (length,) = struct.unpack_from("<Q", canonical)
    padded = struct.pack("<Q", length + 64) + canonical[8 : 8 + length] + b" " * 64 + canonical[8 + length :]
    assert "header is not in canonical form" in audit_segment(honest, tmp_path / "header", padded)
    spaced = torch.frombuffer(bytearray(b" " + tensor_json_bytes(honest, "runtime/config.json")), dtype=torch.uint8)
    reason = audit_segment(with_rest(honest, {"runtime/config.json": spaced}), tmp_path / "json")
    assert "a JSON entry is not in canonical form" in reason
    whitespace = torch.frombuffer(bytearray(b" " * (4 * 1024 * 1024)), dtype=torch.uint8)
    assert "refused unparsed" in audit_segment(with_rest(honest, {"runtime/config.json": whitespace}), tmp_path / "large")


def tensor_json_bytes(run: Run, name: str) -> bytes:
    return run.states[J].rest[name].numpy().tobytes()


def test_parsing_copies_each_tensor_once():
    """Peak memory of parsing is the parsed tensors (≤ 1× the bytes), beside the opened bytes themselves."""
    data = serialize({f"t{i}": torch.zeros(1024 * 1024 // 4) for i in range(16)})  # 16 MiB
    tracemalloc.start()
    try:
        tensors = deserialize(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tensors) == 16 and peak <= 1.05 * len(data), peak / len(data)


def test_json_entries_are_bounded_and_round_trip():
    value = {"lr": 0.003, "betas": [0.9, 0.999]}
    assert tensor_json(json_tensor(value)) == value
    with pytest.raises(ValueError, match="over the limit"):
        tensor_json(torch.zeros(2 * 1024 * 1024, dtype=torch.uint8))
    with pytest.raises(CanonicalError):
        deserialize(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"[" * 16)

"""Parsing opened files in place (issue #10): tensors are views of the opened bytearray, no second copy.

``deserialize(bytearray, in_place=True)`` must give exactly what the copying parse gives, refuse
exactly what it refuses, align every tensor for its dtype, and keep the buffer alive and unresizable
under its tensors; the audit, which opens through it, must hold the opened bytes and no more.
"""

from __future__ import annotations

import json
import math
import struct
import tracemalloc
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainmaster.jobs.canonical import CanonicalError, deserialize, serialize
from trainmaster.jobs.checkpoint import DECISIONS, REST, WEIGHTS, segment_dir
from trainmaster.jobs.commitment import read_commitment
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.verify.audit import run_audit
from trainmaster.verify.openings import LocalOpenings, open_checked

MIXED = {
    "a.json": torch.tensor([1, 2, 3], dtype=torch.uint8),  # odd length: everything after it starts misaligned
    "b": torch.randn(3, 4),
    "c": torch.arange(5),
    "d": torch.tensor([True, False, True]),
    "e": torch.randn(2, dtype=torch.float64),
    "f": torch.zeros(0, 3),
    "g": torch.randn(3).to(torch.bfloat16),
    "h": torch.tensor([-7, 9], dtype=torch.int16),
}


def _aligned(tensors: dict[str, torch.Tensor]) -> bool:
    return all(t.numel() == 0 or t.data_ptr() % t.element_size() == 0 for t in tensors.values())


def test_in_place_gives_the_copying_parse_aligned_and_writable():
    data = serialize(MIXED)
    buffer = bytearray(data)
    parsed = deserialize(buffer, in_place=True)
    assert parsed.keys() == MIXED.keys()
    for name, tensor in MIXED.items():
        assert parsed[name].dtype == tensor.dtype and torch.equal(parsed[name], tensor), name
    assert _aligned(parsed)
    assert parsed["b"].data_ptr() != MIXED["b"].data_ptr()  # views of the buffer, not of anything else
    parsed["b"].add_(1)
    parsed["e"].mul_(2)
    assert torch.equal(parsed["c"], MIXED["c"]) and torch.equal(parsed["g"], MIXED["g"])  # no overlap
    assert torch.equal(parsed["b"], MIXED["b"] + 1)
    assert serialize(deserialize(data)) == data  # the copying parse leaves its input alone


def test_the_buffer_cannot_be_resized_under_its_tensors():
    buffer = bytearray(serialize(MIXED))
    parsed = deserialize(buffer, in_place=True)
    with pytest.raises(BufferError):
        buffer.extend(b"\0")
    del parsed
    buffer.extend(b"\0")  # released with the last tensor


def test_in_place_needs_a_bytearray():
    with pytest.raises(TypeError, match="bytearray"):
        deserialize(serialize(MIXED), in_place=True)


def _padded(text: bytes) -> bytes:
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _rebuild(header: dict, body: bytes) -> bytes:
    return _padded(json.dumps(header, sort_keys=True, separators=(",", ":")).encode()) + body


def test_in_place_refuses_what_the_copying_parse_refuses():
    data = serialize({"a": torch.ones(2), "b": torch.zeros(2)})
    length = struct.unpack("<Q", data[:8])[0]
    header, body = json.loads(data[8 : 8 + length]), data[8 + length :]
    cases = {
        "trailing bytes": data + b"\0",
        "truncated": data[:-1],
        "no header length": data[:7],
        "header length into the data": struct.pack("<Q", length + 8) + data[8:],
        "huge header length": struct.pack("<Q", 2**40) + data[8:],
        "unknown dtype": _rebuild(dict(header, a=dict(header["a"], dtype="C64")), body),
        "offsets past the data": _rebuild(dict(header, b=dict(header["b"], data_offsets=[8, 24], shape=[4])), body),
        "escapes in the header": _padded(data[8 : 8 + length].rstrip().replace(b'"a":', b'"\\u0061":', 1)) + body,
        "deep header": struct.pack("<Q", 16) + b"[" * 16,
    }
    for case, bad in cases.items():
        for parse in (lambda b: deserialize(b), lambda b: deserialize(bytearray(b), in_place=True)):
            try:
                parse(bad)
            except CanonicalError:
                continue
            pytest.fail(f"accepted: {case}")


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_./]{0,6}", fullmatch=True),
        st.tuples(
            st.sampled_from([torch.float32, torch.float64, torch.int64, torch.int16, torch.uint8, torch.bool]),
            st.lists(st.integers(0, 5), max_size=3),
        ),
        max_size=6,
    )
)
def test_in_place_matches_the_copying_parse_on_any_layout(spec):
    state = {name: torch.arange(math.prod(shape)).reshape(shape).to(dtype) for name, (dtype, shape) in spec.items()}
    data = serialize(state)
    copied, in_place = deserialize(data), deserialize(bytearray(data), in_place=True)
    assert copied.keys() == in_place.keys() == state.keys()
    assert all(torch.equal(copied[n], in_place[n]) and copied[n].dtype == in_place[n].dtype for n in state)
    assert _aligned(in_place)


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> tuple[Path, object, dict]:
    """A tiny-lm run of T = 2, k = 1 (its last segment has Adam moments on both sides)."""
    root = tmp_path_factory.mktemp("run")
    config = {"steps": 2, "d_model": 128, "heads": 4, "layers": 2, "seq_len": 8, "batch_size": 2, "warmup": 1}
    recipe = get_recipe("tiny-lm")
    run(recipe, recipe.config(config), RuntimeSettings(job_id="m", output_dir=root, checkpoint_dir=root / "ckpt", seed=0, segment_steps=1))
    return root / "ckpt", read_commitment(root / "commitment.json"), config


def _first_files(directory: Path) -> int:
    """The bytes ``open_checked`` reads for segment 1: S_1, its trace and the weights of S_2."""
    here, after = segment_dir(directory, 1), segment_dir(directory, 2)
    return sum(path.stat().st_size for path in (here / WEIGHTS, here / REST, here / DECISIONS, after / WEIGHTS))


def test_an_opened_segment_is_its_bytes_and_no_copy(committed):
    """tracemalloc sees the opened bytearrays (torch's own allocations it does not): parsed in place,
    they are the whole of it (before: each file's bytes plus a parsed copy of the largest, 1.6×)."""
    directory, commitment, _ = committed
    opened = _first_files(directory)
    tracemalloc.start()
    try:
        opening = open_checked(LocalOpenings(directory), commitment, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert opened > 3_000_000 and opening.state.rest
    assert peak <= 1.05 * opened, peak / opened
    assert _aligned(opening.state.weights) and _aligned(opening.state.rest) and _aligned(opening.next_weights)


@pytest.mark.slow
def test_the_audit_lets_the_weights_go_before_it_opens_the_next_rest(committed):
    """The whole audit of a segment holds, of what it opened, at most what ``open_checked`` read: the
    weights of S_i and S_{i+1} go once compared, before the rest of S_{i+1} comes in (kept, it would
    be 1.5× that; parsed copies as well, 2.1×)."""
    directory, commitment, config = committed
    opened = _first_files(directory)
    tracemalloc.start()
    try:
        report = run_audit(
            commitment=commitment, openings=LocalOpenings(directory), segments=[1], recipe="tiny-lm", config=config, seed=0, tau=1.0
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.passed, report.reasons
    assert report.segments[0].exact_compared > 0 and report.segments[0].fields  # the rest of S_2 was compared
    assert peak <= 1.25 * opened, peak / opened

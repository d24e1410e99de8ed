"""The canonical serialization: exact bytes, safetensors compatibility, strict parsing, refusals."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load as safetensors_load

from trainmaster.jobs.canonical import (
    FORMAT,
    CanonicalError,
    canonical_tensors,
    chunks,
    deserialize,
    serialize,
    sha256_of,
    state_sha256,
)


def test_bytes_are_exactly_the_documented_layout():
    data = serialize({"b": torch.tensor([1, 2], dtype=torch.int16), "a": torch.tensor(1.5, dtype=torch.float64)})
    header = (
        '{"__metadata__":{"format":"trainmaster-canonical-v1"},'
        '"a":{"data_offsets":[0,8],"dtype":"F64","shape":[]},'
        '"b":{"data_offsets":[8,12],"dtype":"I16","shape":[2]}}'
    ).encode()
    header += b" " * (-len(header) % 8)
    expected = struct.pack("<Q", len(header)) + header + struct.pack("<d", 1.5) + struct.pack("<hh", 1, 2)
    assert data == expected


def test_insertion_order_and_memory_layout_do_not_change_the_bytes():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    one = serialize({"x": x.t().contiguous(), "y": torch.zeros(2)})
    other = serialize({"y": torch.zeros(2), "x": x.t()})  # a non-contiguous view of the same values
    assert one == other
    assert serialize({"x": np.arange(3, dtype=np.int64)}) == serialize({"x": torch.arange(3)})


def test_safetensors_reads_canonical_bytes_and_they_round_trip():
    state = {
        "w": torch.randn(3, 5),
        "half": torch.randn(4).to(torch.bfloat16),
        "flags": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "step": torch.tensor(7),
    }
    data = serialize(state)
    for loaded in (safetensors_load(data), deserialize(data)):
        assert loaded.keys() == state.keys()
        for name, tensor in state.items():
            assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor)
    assert json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])["__metadata__"] == {"format": FORMAT}


def test_hash_over_chunks_equals_hash_of_the_bytes():
    state = {"a": torch.randn(1000), "b": torch.arange(10)}
    assert state_sha256(state) == hashlib.sha256(serialize(state)).hexdigest()
    assert sha256_of(chunks(canonical_tensors(state))).hexdigest() == state_sha256(state)


@pytest.mark.parametrize(
    "value, message",
    [
        (np.array([object(), 1], dtype=object), "numpy array of dtype object"),
        (torch.zeros(2, dtype=torch.complex64), "unsupported dtype"),
        (torch.zeros(2, dtype=torch.uint32), "unsupported dtype"),
        (np.zeros(2, dtype=np.uint32), "unsupported dtype torch.uint32"),
        (np.array(["text"]), "unsupported numpy dtype"),
        (torch.zeros(3, 3).to_sparse(), "not a dense tensor"),
        ({"nested": 1}, "is a dict, not a tensor"),
        (3.0, "is a float, not a tensor"),
    ],
)
def test_entries_without_a_canonical_form_are_refused(value, message):
    with pytest.raises(CanonicalError, match=message):
        serialize({"x": value})


@pytest.mark.parametrize("name", ["", "__metadata__", "has space", "ünicode", 'quote"'])
def test_names_outside_the_canonical_alphabet_are_refused(name):
    with pytest.raises(CanonicalError, match="not canonical"):
        serialize({name: torch.zeros(1)})


def _header_and_data(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def _rebuild(header: dict, body: bytes, extra: bytes = b"") -> bytes:
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8) + extra
    return struct.pack("<Q", len(text)) + text + body


def test_parser_refuses_non_canonical_files():
    data = serialize({"a": torch.ones(2), "b": torch.zeros(2)})
    header, body = _header_and_data(data)
    assert _rebuild(header, body) == data
    length = struct.unpack("<Q", data[:8])[0]
    swapped = dict(header, a=dict(header["a"], data_offsets=[8, 16]), b=dict(header["b"], data_offsets=[0, 8]))
    cases = {
        "data in another order": _rebuild(swapped, body),
        "trailing bytes": data + b"\0",
        "truncated": data[:-1],
        "no metadata": _rebuild({k: v for k, v in header.items() if k != "__metadata__"}, body),
        "other format": _rebuild(dict(header, __metadata__={"format": "x"}), body),
        "extra header padding": _rebuild(header, body, extra=b" " * 8),
        "header length into the data": struct.pack("<Q", length + 8) + data[8:],
        "huge header length": struct.pack("<Q", 2**40) + data[8:],
        "unknown dtype": _rebuild(dict(header, a=dict(header["a"], dtype="C64")), body),
    }
    for case, bad in cases.items():
        try:
            deserialize(bad)
        except CanonicalError:
            continue
        pytest.fail(f"accepted: {case}")


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9_./]{0,6}", fullmatch=True),
        st.tuples(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool]),
                  st.lists(st.integers(0, 3), max_size=3)),
        max_size=5,
    )
)
def test_round_trip_is_identity_on_bytes(spec):
    generator = torch.Generator().manual_seed(0)
    state = {name: (torch.rand(shape, generator=generator) * 100).to(dtype) for name, (dtype, shape) in spec.items()}
    data = serialize(state)
    assert serialize(deserialize(data)) == data

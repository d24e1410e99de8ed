"""Safe loading of executor files: hostile pickles, crafted headers, bad offsets, NaN/Inf, size caps."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from trainmaster.verify import safeload
from trainmaster.verify.safeload import SafeLoadError, check_declared_size, check_file, inspect, load_checked

READERS = [
    pytest.param(lambda p, **kw: inspect(p, **kw), id="inspect"),
    pytest.param(lambda p, **kw: check_file(p, **kw), id="check_file"),
    pytest.param(lambda p, **kw: load_checked(p, **kw), id="load_checked"),
]


def craft(path: Path, header: dict | bytes, data: bytes = b"", *, length: int | None = None) -> Path:
    """A file laid out by hand: 8-byte length, header bytes, data."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def f32(name: str, shape: list[int], begin: int) -> dict:
    size = 4 * (shape[0] if shape else 1) * (shape[1] if len(shape) > 1 else 1)
    return {name: {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + size]}}


def assert_refused(path: Path, match: str, *, values: bool = False, **kw) -> None:
    """Every reader refuses ``path`` (only the value-checking ones when ``values``)."""
    for read in (check_file, load_checked) if values else (inspect, check_file, load_checked):
        with pytest.raises(SafeLoadError, match=match):
            read(path, **kw)


# pickles never run


class Payload:
    """Unpickling this creates ``marker``: the proof that something was unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return builtins.open, (str(self.marker), "w")


def test_the_payload_does_fire_when_unpickled(tmp_path):
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(Payload(probe))).close()
    assert probe.exists()  # so the marker staying absent below means nothing was unpickled


@pytest.mark.parametrize("name", ["model.safetensors", "model.pt", "model.pkl", "model.bin"])
@pytest.mark.parametrize("writer", ["pickle-p0", "pickle-p2", "pickle-p5", "torch.save"])
@pytest.mark.parametrize("read", READERS)
def test_pickles_are_refused_without_unpickling(tmp_path, name, writer, read):
    marker = tmp_path / "marker"
    path = tmp_path / name
    if writer == "torch.save":
        torch.save({"weight": torch.zeros(2), "evil": Payload(marker)}, path)
    else:
        path.write_bytes(pickle.dumps(Payload(marker), protocol=int(writer[-1])))
    with pytest.raises(SafeLoadError) as caught:
        read(path)
    assert not marker.exists()
    if name.endswith(".safetensors") and writer != "pickle-p0":
        assert "pickle" in caught.value.reason
    if not name.endswith(".safetensors"):
        assert "only .safetensors files are loaded" in caught.value.reason


# header bounds and strict parsing


def test_header_over_16_mib_is_refused_before_it_is_read(tmp_path):
    assert_refused(craft(tmp_path / "a.safetensors", b"{}", length=16 * 2**20 + 1), "over the limit of 16777216")


def test_real_17_mib_header_is_refused(tmp_path):
    header = json.dumps({"__metadata__": {"pad": "x" * (17 * 2**20)}}).encode()
    assert_refused(craft(tmp_path / "a.safetensors", header), "over the limit")


@pytest.mark.parametrize(
    "header, match",
    [
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', "duplicate key 'a'"),
        (b'{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}', "NaN is not JSON"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}', "not strict JSON"),
        (b'{"\xff": 1}', "not UTF-8"),
        (b' {"a": 1}', "does not start with"),
        (b'[1, 2]', "does not start with"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": 1}}', "exactly the keys"),
        (b'{"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}', "unsupported dtype 'C64'"),
        (b'{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "not a list of non-negative"),
        (b'{"a": {"dtype": "F32", "shape": [true], "data_offsets": [0, 4]}}', "not a list of non-negative"),
        (b'{"a": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}}', "not a list of non-negative"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "end before they begin"),
        (b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}', "not a pair"),
        (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', "shape \\[2\\] of F32 needs 8"),
        (b'{"__metadata__": {"a": 1}}', "__metadata__ must map strings to strings"),
    ],
)
def test_malformed_headers_are_refused(tmp_path, header, match):
    assert_refused(craft(tmp_path / "a.safetensors", header, b"\0" * 8), match)


def test_tiny_file_is_refused(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"\x02\0\0")
    assert_refused(tmp_path / "a.safetensors", "too short")


def test_header_past_the_end_is_refused(tmp_path):
    assert_refused(craft(tmp_path / "a.safetensors", b"{}", length=100), "runs past the end")


# offsets tile the buffer exactly


def test_overlapping_offsets_are_refused(tmp_path):
    header = {**f32("a", [2], 0), **f32("b", [2], 4)}
    assert_refused(craft(tmp_path / "a.safetensors", header, b"\0" * 12), "overlaps")


def test_hole_between_tensors_is_refused(tmp_path):
    header = {**f32("a", [1], 0), **f32("b", [1], 8)}
    assert_refused(craft(tmp_path / "a.safetensors", header, b"\0" * 12), "hole of 4 unindexed bytes before tensor 'b'")


def test_hole_at_the_start_is_refused(tmp_path):
    assert_refused(craft(tmp_path / "a.safetensors", f32("a", [1], 4), b"\0" * 8), "hole of 4")


def test_offsets_out_of_range_are_refused(tmp_path):
    assert_refused(craft(tmp_path / "a.safetensors", f32("a", [4], 0), b"\0" * 8), "index 16 bytes of data, the file holds only 8")


def test_trailing_polyglot_bytes_are_refused(tmp_path):
    assert_refused(craft(tmp_path / "a.safetensors", f32("a", [1], 0), b"\0" * 4 + b"PK\x03\x04zip"), "7 trailing bytes")


def test_trailing_bytes_after_a_valid_library_file_are_refused(tmp_path):
    path = tmp_path / "a.safetensors"
    save_file({"w": torch.ones(3)}, str(path))
    with open(path, "ab") as handle:
        handle.write(b"\x80\x04payload")
    assert_refused(path, "trailing bytes")


# expected names, dtypes and shapes


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file({"fc.weight": torch.randn(4, 3), "fc.bias": torch.randn(4), "step": torch.tensor(3)}, str(path))
    return path


EXPECTED = {"fc.weight": ("F32", (4, 3)), "fc.bias": ("F32", (4,)), "step": ("I64", ())}


def test_expected_set_accepts_exact_match(model):
    assert check_file(model, expected=EXPECTED).expected() == EXPECTED
    assert set(load_checked(model, expected=EXPECTED)) == set(EXPECTED)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"fc.extra": ("F32", (1,))}, "missing tensors 'fc.extra'"),
        ({"fc.bias": ("F64", (4,))}, r"tensor 'fc.bias' is F32\[4\], expected F64\[4\]"),
        ({"fc.weight": ("F32", (3, 4))}, r"tensor 'fc.weight' is F32\[4, 3\], expected F32\[3, 4\]"),
        ({"step": None}, "unexpected tensors 'step'"),
    ],
)
def test_expected_set_mismatch_is_refused(model, change, match):
    expected = {**EXPECTED, **change}
    expected = {k: v for k, v in expected.items() if v is not None}
    assert_refused(model, match, values=True, expected=expected)


# values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_are_refused(tmp_path, dtype, bad):
    values = torch.zeros(100, dtype=dtype)
    values[77] = bad
    path = tmp_path / "a.safetensors"
    save_file({"ok": torch.ones(3), "w": values}, str(path))
    inspect(path)  # the header alone is fine
    assert_refused(path, f"tensor 'w' holds {'NaN' if bad != bad else '±Inf'}", values=True)


def test_nan_is_found_in_a_later_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(safeload, "CHUNK_BYTES", 64)
    values = torch.zeros(1000)
    values[999] = float("nan")
    path = tmp_path / "a.safetensors"
    save_file({"w": values}, str(path))
    assert_refused(path, "holds NaN", values=True)


def test_bool_bytes_other_than_0_and_1_are_refused(tmp_path):
    header = {"b": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}}
    path = craft(tmp_path / "a.safetensors", header, b"\x00\x01\x07")
    inspect(path)
    assert_refused(path, "bool bytes other than 0 and 1", values=True)


# sizes and kinds of file


def test_file_over_the_cap_is_refused_before_reading(model):
    size = model.stat().st_size
    assert_refused(model, f"{size} bytes is over the cap of {size - 1}", max_bytes=size - 1)
    check_file(model, max_bytes=size)


def test_declared_size_over_the_cap_is_refused():
    check_declared_size("model.safetensors", 100, 100)
    with pytest.raises(SafeLoadError, match="declared size 101 bytes is over the cap of 100"):
        check_declared_size("model.safetensors", 101, 100)


def test_symlinks_and_non_files_are_refused(tmp_path, model):
    link = tmp_path / "link.safetensors"
    link.symlink_to(model)
    assert_refused(link, "cannot open")
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    assert_refused(folder, "not a regular file")
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    assert_refused(fifo, "not a regular file")


def test_missing_file_is_refused(tmp_path):
    assert_refused(tmp_path / "absent.safetensors", "cannot open")


# valid files load exactly


def test_load_matches_the_safetensors_library(tmp_path):
    tensors = {
        "a": torch.randn(5, 7),
        "b": torch.randn(3, dtype=torch.float64),
        "c": torch.randn(4).to(torch.bfloat16),
        "d": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "e": torch.zeros(0, 3),
        "f": torch.tensor(True),
        "g": torch.tensor([1, 0, 1], dtype=torch.bool),
    }
    path = tmp_path / "a.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    header = check_file(path)
    assert header.metadata == {"format": "pt"}
    assert header.largest_tensor_bytes == 35 * 4
    loaded, reference = load_checked(path, expected=header.expected()), load_file(str(path))
    assert loaded.keys() == reference.keys()
    for name, tensor in reference.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape
        assert torch.equal(loaded[name], tensor), name


def test_deeply_nested_header_is_refused(tmp_path):
    assert_refused(craft(tmp_path / "a.safetensors", b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"), "nests too deeply|not strict JSON")


# isolation in a child process under limits


def test_isolated_check_reports_each_file(tmp_path, model):
    from trainmaster.verify.safeload import check_files_isolated

    bad = tmp_path / "bad.safetensors"
    save_file({"w": torch.tensor([float("nan")])}, str(bad))
    results = check_files_isolated({model: EXPECTED, bad: None})
    assert [r.reason for r in results] == [None, "bad.safetensors: tensor 'w' holds NaN"]
    assert results[0].tensors == 3 and results[0].size == model.stat().st_size


def test_isolated_check_past_its_memory_limit_is_refused(tmp_path, model):
    from trainmaster.verify.safeload import check_files_isolated

    big = tmp_path / "big.safetensors"
    save_file({"w": torch.zeros(4 * 1024 * 1024)}, str(big))  # 16 MiB: its 8 MiB read buffer is over the limit
    results = check_files_isolated({model: None, big: None}, memory_bytes=2 * 1024 * 1024)
    assert results[0].reason is None
    assert results[1].reason == "big.safetensors: checking it ran out of the loader's memory limit (a hostile file)"

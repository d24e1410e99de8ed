"""The checkpoint writer's bytes and commitment are pinned: a fixed state gives the same files, chunk digests and leaf.

The values were produced by the writer before it hashed and wrote in one pass (commitment format 2);
any change to the writer, the chunk hashing or the pool that runs it must leave every one of them as it is.

The state is made of integer arithmetic and single, correctly rounded float operations only, so it is the same bytes
on every CPU. It was made of `sin` and `cos` until a host with AVX-512 (Sapphire Rapids) gave another state: torch
takes them from MKL's vector math, whose results depend on the instruction set it dispatches to (MKL_CBWR=AVX and
MKL_CBWR=AVX2 differ in the last bit); the pins were made again from today's writer once it was shown to give every
old pin from the old state under MKL_CBWR=COMPATIBLE.
"""

from __future__ import annotations

import hashlib
import json

import torch

from trainmaster.jobs.checkpoint import DECISIONS, MANIFEST, REST, WEIGHTS, read_segment, segment_dir, write_segment
from trainmaster.jobs.chunks import ChunkTree, file_digest
from trainmaster.jobs.state import TrainState


def _spread(count: int, salt: int) -> torch.Tensor:
    """`count` float32 values in [-1, 1) that look random, the same bits on any CPU: integer hashing (exact), then a
    conversion of integers below 2**24 (exact) and one division and one subtraction (each correctly rounded)."""
    codes = (torch.arange(count, dtype=torch.int64) * 2_654_435_761 + salt * 40_503).remainder(65_521)
    return codes.to(torch.float32) / 32_760.5 - 1.0


def _state(scale: int) -> tuple[TrainState, dict[str, torch.Tensor]]:
    """Tensors of odd sizes (chunk runs and tensor seams fall anywhere), their values fixed without an RNG and
    without a function whose last bit depends on the machine (module docstring)."""
    weights = {f"layers.{i}.weight": _spread(scale * (i + 1) + 7, i) for i in range(5)}
    weights["embed"] = torch.arange(3 * scale + 1, dtype=torch.int64).remainder(251).to(torch.uint8)
    rest = {}
    for name, tensor in weights.items():
        if tensor.dtype == torch.float32:
            rest[f"optimizer/state/{name}/exp_avg"] = tensor * 1e-3
            rest[f"optimizer/state/{name}/exp_avg_sq"] = (tensor * tensor) * 1e-6
            rest[f"optimizer/state/{name}/step"] = torch.tensor(100.0)
    trace = {"loss": torch.arange(25, dtype=torch.float64) / 3, "batch": torch.arange(50, dtype=torch.int64)}
    return TrainState(weights=weights, rest=rest), trace


# scale -> (plain sha256 of weights, rest, decisions files; weights digest; rest digest; trace digest; leaf)
PINNED = {
    1_000: (
        "1001b1ffe5ad9ac9f9af08a3f9544fd5fbfeb2f8cf746d7429f3ffccaed78ee1",
        "cf07d54f3669a264f6e8c97a89743c50e5eb59207f78d6772900673eba3de979",
        "6bb162155e14b76135108fd3c9743dbc96ba216b659dddfc68018cffbb4b93d2",
        "5a0113fc5c2053b62e7c1f869e741597f3ba20f873b8791d8b01bf12e90f5a2d",
        "8a64202a52d2fa5892719d996a78f0bdc5449963a023a716601edf4a36cac625",
        "c94a6c25f4459b1fda948397cbd237c5960e7fc0c4205bf972bb1e60c5ea9153",
        "f92e969b7b1d719523a49c3956fbac07037a87bc8863737999762f39d0438d8b",
    ),
    150_001: (
        "561a4d3c63e9bf7a50308ed598787d59e76b861a20f56debcd9de8768270da26",
        "7541834b1f8a92fbf2d1cbebee18bffac0aee225982363ea0e00d5a4af0a50cf",
        "6bb162155e14b76135108fd3c9743dbc96ba216b659dddfc68018cffbb4b93d2",
        "7526ceb843f666f69cccef55afb7fa768130c7e1203aef6a3ae63f596f531350",
        "b3de20c7bf1f5463a0b589f111a7084caba02236eddbb7e2a497e5297a9ccdcf",
        "c94a6c25f4459b1fda948397cbd237c5960e7fc0c4205bf972bb1e60c5ea9153",
        "23d93a0527eb2953e229aea62570830db241106b40d79a208720839ae3adb97d",
    ),
}


def _observed(tmp_path, scale: int) -> tuple[str, ...]:
    state, trace = _state(scale)
    manifest = write_segment(tmp_path, 3, state, trace, job_id="pin", recipe="pin", step=75, k=25)
    directory = segment_dir(tmp_path, 3)
    plain = tuple(hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in (WEIGHTS, REST, DECISIONS))
    files = manifest.files
    return (*plain, files[WEIGHTS].sha256, files[REST].sha256, files[DECISIONS].sha256, manifest.leaf)


def test_pinned_small_and_large_states(tmp_path):
    """A state hashed inline (under 8 MB) and one hashed on the pool (about 28 MB, many 64 KiB chunks):
    the files on disk, each file's chunk digest and the leaf are exactly those of the format."""
    for scale, expected in PINNED.items():
        assert _observed(tmp_path / str(scale), scale) == expected, scale


def test_written_files_agree_with_an_independent_digest(tmp_path):
    """The digests in the manifest are those of the bytes on disk, recomputed serially and as a ChunkTree,
    and the segment reads back whole."""
    state, trace = _state(150_001)
    manifest = write_segment(tmp_path, 0, state, trace, job_id="pin", recipe="pin", step=0, k=25)
    directory = segment_dir(tmp_path, 0)
    for name in (WEIGHTS, REST, DECISIONS):
        data = (directory / name).read_bytes()
        assert len(data) == manifest.files[name].bytes
        assert file_digest([data], parallel=False) == ChunkTree([data]).digest == manifest.files[name].sha256
    assert json.loads((directory / MANIFEST).read_text())["leaf"] == manifest.leaf
    loaded = read_segment(directory)
    assert all(torch.equal(loaded.state.weights[n], t) for n, t in state.weights.items())

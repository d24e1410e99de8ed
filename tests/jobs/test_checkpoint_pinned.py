"""The checkpoint writer's bytes and commitment are pinned: a fixed state gives the same files, chunk digests and leaf.

The values were produced by the writer before it hashed and wrote in one pass (commitment format 2);
any change to the writer, the chunk hashing or the pool that runs it must leave every one of them as it is.
"""

from __future__ import annotations

import hashlib
import json

import torch

from trainmaster.jobs.checkpoint import DECISIONS, MANIFEST, REST, WEIGHTS, read_segment, segment_dir, write_segment
from trainmaster.jobs.chunks import ChunkTree, file_digest
from trainmaster.jobs.state import TrainState


def _state(scale: int) -> tuple[TrainState, dict[str, torch.Tensor]]:
    """Tensors of odd sizes (chunk runs and tensor seams fall anywhere), their values fixed without an RNG."""
    weights = {f"layers.{i}.weight": (torch.arange(scale * (i + 1) + 7, dtype=torch.float32) * 0.37 + i).sin()
               for i in range(5)}
    weights["embed"] = torch.arange(3 * scale + 1, dtype=torch.int64).remainder(251).to(torch.uint8)
    rest = {}
    for name, tensor in weights.items():
        if tensor.dtype == torch.float32:
            rest[f"optimizer/state/{name}/exp_avg"] = tensor.cos() * 1e-3
            rest[f"optimizer/state/{name}/exp_avg_sq"] = (tensor * tensor) * 1e-6
            rest[f"optimizer/state/{name}/step"] = torch.tensor(100.0)
    trace = {"loss": torch.arange(25, dtype=torch.float64) / 3, "batch": torch.arange(50, dtype=torch.int64)}
    return TrainState(weights=weights, rest=rest), trace


# scale -> (plain sha256 of weights, rest, decisions files; weights digest; rest digest; trace digest; leaf)
PINNED = {
    1_000: (
        "d934b9d745e95ecdc84d0619187c55462a4b7825e58d917880e6d8d1f49fb2ab",
        "87389bbe44bca18b8d71726310817557c55b2e67d8e0bb271b4d249d3acc2464",
        "6bb162155e14b76135108fd3c9743dbc96ba216b659dddfc68018cffbb4b93d2",
        "3529a1923c7483d4858ac76bfafd69cd604d2d8bd18410e9a1db1af15a49e354",
        "9e6b0499d6794742182329d8e17d727f53986280b3d4f5ee1f598eeab681f074",
        "c94a6c25f4459b1fda948397cbd237c5960e7fc0c4205bf972bb1e60c5ea9153",
        "d4ddb64d2c6c5e643ab8eb2fc7a0dd5f72f58b4a9fd75d4ce2e8b050e58d0c93",
    ),
    150_001: (
        "8b9ac8e344c3233805f4ecf585a4a86ec1a550c26f5603c9718cad93bcb27200",
        "0ba53e1dce2fe9d488aa864e991925a677e4c31055b733c645f67dd690f54cc5",
        "6bb162155e14b76135108fd3c9743dbc96ba216b659dddfc68018cffbb4b93d2",
        "45ab1e1370630b1c9ae7fa90f3e535f6f9359ec281da5607f27e4033c75e6b9d",
        "ad9570a1d93cd929b92b36f68e5794e2e71915be15ad10a2cde7b3cce1c98a58",
        "c94a6c25f4459b1fda948397cbd237c5960e7fc0c4205bf972bb1e60c5ea9153",
        "b00e5aff5978bc748dad8ce089688a825961e738f6e21caa84d23fcf3fcfa7b4",
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

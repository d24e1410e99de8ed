"""The safety scan of checkpoint segments: headers only, hostile files still refused.

A checkpoint directory holds three safetensors files per segment (401 segments for T = 10,000 at
k = 25); scanning every value made `trainmaster verify DIR` cost over 5 % of training. Segments are
committed by the signed Merkle root and the replay audit opens the challenged ones strictly, so the
scan reads only their headers — but a link, a pickle under a .safetensors name or a malformed header
in checkpoints/segments/ is refused as anywhere else, and NaN weights in a challenged segment are
rejected by the audit.
"""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from trainmaster.broker.cli import app
from trainmaster.verify.safeload import check_files

SEGMENT = "checkpoints/segments/00000001"


def invoke(*args: str):
    return CliRunner().invoke(app, ["verify", *args])


@pytest.fixture
def outputs(tmp_path, tm_home) -> Path:
    """Finite final weights and two segments of three safetensors files each, with their manifests."""
    root = tmp_path / "outputs"
    root.mkdir()
    save_file({"w": torch.ones(4)}, str(root / "model.safetensors"))
    for index in (0, 1):
        folder = root / f"checkpoints/segments/{index:08d}"
        folder.mkdir(parents=True)
        save_file({"w": torch.ones(4)}, str(folder / "weights.safetensors"))
        save_file({"optim/exp_avg": torch.zeros(4), "done": torch.tensor([True])}, str(folder / "rest.safetensors"))
        save_file({"step/0/action": torch.tensor([1])}, str(folder / "decisions.safetensors"))
        (folder / "manifest.json").write_text('{"format": "trainmaster-checkpoint-v1"}\n')
    return root


def test_finite_outputs_with_segments_are_accepted(outputs):
    result = invoke(str(outputs), "--json")
    assert result.exit_code == 0, result.output
    safety = json.loads(result.output)["evidence"]["safety"]
    assert safety["headers_only"] == 6
    assert len(safety["safetensors_checked"]) == 7


def test_nan_in_a_segment_costs_no_value_read_but_nan_elsewhere_is_refused(outputs):
    """Segment files' values are not read (the audit judges the challenged ones); any other file's are."""
    nan = {"w": torch.tensor([1.0, float("nan"), 2.0, 3.0])}
    save_file(nan, str(outputs / SEGMENT / "weights.safetensors"))
    bools = {"optim/exp_avg": torch.zeros(4), "done": torch.tensor([True])}
    save_file(bools, str(outputs / SEGMENT / "rest.safetensors"))
    _poke(outputs / SEGMENT / "rest.safetensors", b"\x07")  # a bool byte other than 0 and 1
    result = invoke(str(outputs), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["evidence"]["safety"]["headers_only"] == 6

    save_file(nan, str(outputs / "checkpoints" / "weights.safetensors"))  # not a segment's file
    result = invoke(str(outputs))
    assert result.exit_code == 1, result.output
    assert "checkpoints/weights.safetensors: tensor 'w' holds NaN" in result.output


def _poke(path: Path, byte: bytes) -> None:
    """Overwrite the first data byte of the bool tensor ``done`` with ``byte``."""
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8 : 8 + length])
    begin, _ = header["done"]["data_offsets"]
    data[8 + length + begin] = byte[0]
    path.write_bytes(bytes(data))


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def _header_past_the_end(path: Path, tmp: Path) -> str:
    path.write_bytes(struct.pack("<Q", 10_000) + b'{"w":{}}')
    return "header length 10000 runs past the end"


def _list_dtype(path: Path, tmp: Path) -> str:
    header = b'{"w":{"dtype":[],"shape":[1],"data_offsets":[0,4]}}'
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return "tensor 'w': unsupported dtype []"


def _overlapping_tensors(path: Path, tmp: Path) -> str:
    header = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
              b'"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return "overlaps the one before it"


def _pickle(path: Path, tmp: Path) -> str:
    path.write_bytes(pickle.dumps(Payload(tmp / "marker"), protocol=4))
    return "is a pickle (protocol 4); pickled data is never loaded"


def _torch_save(path: Path, tmp: Path) -> str:
    torch.save({"w": torch.ones(1), "evil": Payload(tmp / "marker")}, path)
    return "is a zip archive"


def _symlink(path: Path, tmp: Path) -> str:
    target = tmp / "elsewhere.safetensors"
    save_file({"w": torch.ones(4)}, str(target))
    path.unlink()
    path.symlink_to(target)
    return f"{SEGMENT}/{path.name} is a symbolic link"


def _pickle_suffix(path: Path, tmp: Path) -> str:
    torch.save({"w": torch.ones(1), "evil": Payload(tmp / "marker")}, path.with_name("optimizer.pt"))
    return f"{SEGMENT}/optimizer.pt is a torch.save archive"


@pytest.mark.parametrize("make", [_header_past_the_end, _list_dtype, _overlapping_tensors, _pickle, _torch_save,
                                  _symlink, _pickle_suffix])
@pytest.mark.parametrize("name", ["weights.safetensors", "rest.safetensors", "decisions.safetensors"])
def test_hostile_segment_files_are_refused(outputs, tmp_path, make, name):
    expected = make(outputs / SEGMENT / name, tmp_path)
    result = invoke(str(outputs))
    assert result.exit_code == 1, result.output  # rejected: the executor's bytes, never "cannot verify"
    assert "unsafe outputs" in result.output and expected in result.output
    assert not (tmp_path / "marker").exists()


def test_headers_only_still_checks_the_header_and_expected_tensors(tmp_path):
    nan = tmp_path / "nan.safetensors"
    save_file({"w": torch.tensor([float("nan")])}, str(nan))
    bad = tmp_path / "bad.safetensors"
    _list_dtype(bad, tmp_path)
    results = check_files({nan: {"w": ("F32", (2,))}, bad: None}, headers_only=[nan, bad])
    assert "tensor 'w' is F32[1], expected F32[2]" in results[0].reason
    assert "unsupported dtype []" in results[1].reason
    (ok,) = check_files({nan: None}, headers_only=[nan])
    assert ok.reason is None and ok.tensors == 1
    (refused,) = check_files({nan: None})
    assert "holds NaN" in refused.reason


@pytest.mark.slow
def test_a_challenged_segment_with_nan_weights_is_rejected_by_the_audit(tmp_path):
    """The safety scan lets NaN segment weights through (headers only); the audit opens them and rejects."""
    from trainmaster.jobs.canonical import deserialize, views
    from trainmaster.jobs.checkpoint import DECISIONS, REST, WEIGHTS, segment_dir, write_segment_bytes
    from trainmaster.jobs.commitment import build_commitment, read_commitment
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.jobs.runtime import RuntimeSettings, run
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.verify.pipeline import Attempt, AuditSettings, verify_attempt
    from trainmaster.jobs.signing import sign_commitment
    from bittensor.sp_core import Keypair

    job, bundle, seed, k = "dqn-nan", "dd" * 32, 3, 10
    options = {"steps": 100, "learning_starts": 30, "buffer_size": 100, "batch_size": 8, "hidden": 16}
    dqn = get_recipe("dqn")
    outputs = tmp_path / "job" / "outputs"
    checkpoints = outputs / "checkpoints"
    run(dqn, dqn.config(options), RuntimeSettings(job_id=job, output_dir=outputs, checkpoint_dir=checkpoints,
                                                  seed=seed, segment_steps=k, bundle_sha256=bundle))
    n = read_commitment(outputs / "commitment.json").n
    for i in range(1, n):  # every S_i but the first and the final: each challenge opens one of them
        here = segment_dir(checkpoints, i)
        weights = deserialize((here / WEIGHTS).read_bytes())
        first = sorted(weights)[0]
        weights[first] = weights[first].clone()
        weights[first].view(-1)[0] = float("nan")
        rest, trace = (here / REST).read_bytes(), (here / DECISIONS).read_bytes()
        write_segment_bytes(checkpoints, i, views(weights), [rest], [trace], job_id=job, recipe="dqn", step=i * k, k=k)
    commitment = build_commitment(checkpoints, job_id=job, bundle_sha256=bundle, n=n, k=k)  # the executor commits to them
    (outputs / "commitment.json").write_bytes(commitment.canonical_json())
    miner = Keypair.create_from_mnemonic(Keypair.generate_mnemonic())
    entry = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in options.items())
    spec = JobSpec(name="dqn", entrypoint=f"python -m trainmaster.jobs.recipes.dqn {entry}", seed=seed,
                   checkpoint={"segment_steps": k}, verification={"challenge_segments": 2})
    attempt = Attempt(job_id=job, attempt_id="a1", outputs=outputs, bundle_sha256=bundle, spec=spec, trusted=False,
                      hotkey=miner.ss58_address, signature=sign_commitment(commitment, miner))

    verdict = verify_attempt(attempt, db_path=tmp_path / "state.db", audit_settings=AuditSettings(tau=1e-3))

    assert verdict.outcome == "rejected", verdict.reasons
    assert verdict.checks == ["integrity", "safety", "replay"]  # the safety scan passed the NaN segments
    assert verdict.evidence["safety"]["headers_only"] == 3 * (n + 1)
    assert "hold NaN or Inf" in verdict.reasons[0]

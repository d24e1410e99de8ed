"""A pickle is a pickle whatever its protocol and name (issue #16 §1): outputs are judged positively.

Protocol 0 and 1 pickles have no magic bytes (protocol 0 is ASCII), so `notes.txt`, `config.yaml`,
`state.dat` or `policy` holding one were accepted and `pickle.load` ran their payload. Now a file
from untrusted compute is kept only when its content is identified as a safe format; pickle streams
are found by parsing their opcodes; tar archives are looked into; and a wrong final hash no longer
hides the unsafe files beside it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from conftest import write_job
from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.commitment import Commitment
from trainmaster.verify import output_kinds
from trainmaster.verify.output_kinds import DATA, PICKLE, UNCHECKED, FileKind, classify
from trainmaster.verify.pickle_stream import pickle_stream


class Payload:
    """Unpickling this creates ``marker``: the proof that something was loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def verify(folder: Path, *args: str) -> tuple[int, dict]:
    """`trainmaster verify DIR --json` in a subprocess: its exit code and verdict."""
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "verify", str(folder), "--json", *args],
                          capture_output=True, text=True, env=os.environ.copy(), check=False)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def legacy_torch_tar(path: Path, marker: Path) -> Path:
    """The legacy torch.save tar layout torch.load still reads: `sys_info`, `pickle`, `tensors`,
    `storages` members, pickles each."""
    with tarfile.open(path, "w") as archive:
        for name, value in (("sys_info", {"protocol_version": 1001}), ("pickle", Payload(marker)),
                            ("tensors", 0), ("storages", 0)):
            data = pickle.dumps(value, protocol=2)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def safe_folder(root: Path) -> Path:
    """Outputs of every safe kind: text, JSON, CSV, a PNG, numeric .npy/.npz, a tar and a zip of text."""
    root.mkdir()
    save_file({"w": torch.ones(2)}, str(root / "model.safetensors"))
    (root / "notes.txt").write_text("step 1 loss 0.5\nconverged after (1.5, 2.0) epochs.\n")
    (root / "config.yaml").write_text("lr: 0.001\ncount: 3\n")
    (root / "result.json").write_text(json.dumps({"accuracy": 0.9}))
    (root / "metrics.csv").write_text("count,loss\n1,0.5\n2,0.4\n")
    (root / "curve.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(40))
    np.save(root / "returns.npy", np.arange(4, dtype=np.float32))
    np.savez(root / "evaluations.npz", timesteps=np.arange(3), results=np.ones((3, 2)))
    with tarfile.open(root / "logs.tar.gz", "w:gz") as archive:
        archive.add(root / "notes.txt", "logs/notes.txt")
    with zipfile.ZipFile(root / "logs.zip", "w") as archive:
        archive.writestr("log.txt", "hello\n")
    return root


# unit: the opcode walk


@pytest.mark.parametrize("protocol", [0, 1])
def test_protocol_0_and_1_pickles_are_found_by_their_opcodes(protocol, tmp_path):
    found = pickle_stream(pickle.dumps(Payload(tmp_path / "m"), protocol=protocol), complete=True)
    assert found == f"a pickle stream (protocol {protocol})"


@pytest.mark.parametrize("text", [b"step 1 loss 0.5\n", b"(1.5, 2.0)\n", b"count,loss\n1,0.5\n", b"lr: 0.1\n",
                                  b"config\nversion\n", b"I think.\n", b'{"a": 1}'])
def test_text_is_no_pickle_stream(text):
    assert pickle_stream(text, complete=True) is None


def test_a_truncated_stream_that_calls_code_before_its_bad_byte_is_a_pickle(tmp_path):
    whole = pickle.dumps(Payload(tmp_path / "m"), protocol=0)
    assert "calls code" in pickle_stream(whole[:-1] + b"\xff junk", complete=True)


def test_a_file_still_parsing_past_what_was_read_is_refused():
    assert "longer than was read" in pickle_stream(b"(lp0\n" + b"I1\naI2\na" * 100, complete=False)


def test_unrecognised_bytes_are_unchecked_and_identified_ones_data(tmp_path):
    (tmp_path / "blob.dat").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "state.dat").write_bytes(pickle.dumps({"a": 1}, protocol=1))
    (tmp_path / "log.gz").write_bytes(gzip.compress(pickle.dumps([1, 2], protocol=0)))
    assert classify(tmp_path / "blob.dat") == FileKind(UNCHECKED, "unrecognised binary data")
    assert classify(tmp_path / "state.dat").what == "a pickle stream (protocol 1)"
    assert classify(tmp_path / "log.gz").what == "a compressed pickle stream (protocol 0)"
    assert classify(legacy_torch_tar(tmp_path / "weights.tar", tmp_path / "m")).kind == PICKLE
    assert {classify(p).kind for p in safe_folder(tmp_path / "safe").iterdir() if p.suffix != ".safetensors"} == {DATA}


# through the CLI


def test_verify_dir_refuses_text_like_pickles_by_name_whatever_they_are_called(tmp_path):
    marker = tmp_path / "marker"
    folder = tmp_path / "outputs"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, str(folder / "model.safetensors"))
    for name, protocol in (("notes.txt", 0), ("config.yaml", 0), ("state.dat", 1), ("policy", 1)):
        (folder / name).write_bytes(pickle.dumps(Payload(marker), protocol=protocol))
    legacy_torch_tar(folder / "weights.tar", marker)
    (folder / "blob.bin2").write_bytes(bytes(range(256)))
    code, verdict = verify(folder)
    assert code == 1 and verdict["outcome"] == "rejected"
    [reason] = verdict["reasons"]
    for name, what in (("notes.txt", "a pickle stream (protocol 0)"), ("config.yaml", "a pickle stream (protocol 0)"),
                       ("state.dat", "a pickle stream (protocol 1)"), ("policy", "a pickle stream (protocol 1)"),
                       ("weights.tar", "a torch.save tar archive"), ("blob.bin2", "unrecognised binary data")):
        assert f"{name} is {what}" in reason
    assert "refused from untrusted compute" in reason
    code, verdict = verify(folder, "--trusted")
    assert code == 0, verdict
    opaque = {item["path"] for item in verdict["evidence"]["safety"]["opaque"]}
    assert opaque == {"notes.txt", "config.yaml", "state.dat", "policy", "weights.tar", "blob.bin2"}
    assert not marker.exists()


def test_verify_dir_accepts_text_json_csv_images_numpy_and_safe_archives(tmp_path):
    code, verdict = verify(safe_folder(tmp_path / "outputs"))
    assert code == 0 and verdict["outcome"] == "accepted", verdict
    assert verdict["evidence"]["safety"]["opaque"] == []


def test_a_protocol_0_pickle_in_a_safe_archive_refuses_it(tmp_path):
    folder = safe_folder(tmp_path / "outputs")
    with tarfile.open(folder / "logs.tar.gz", "w:gz") as archive:
        archive.add(folder / "notes.txt", "logs/notes.txt")
        data = pickle.dumps(Payload(tmp_path / "marker"), protocol=0)
        info = tarfile.TarInfo("logs/more.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    code, verdict = verify(folder)
    assert code == 1 and "logs.tar.gz is a tar archive holding pickles (pickles inside: logs/more.txt)" in verdict["reasons"][0]


def test_a_wrong_final_hash_does_not_hide_a_nan_tensor_or_a_corrupt_file(tmp_path):
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(serialize({"w": torch.ones(4)}))
    commitment = Commitment(job_id="j", bundle_sha256="ab" * 32, root="cd" * 32, final_sha256="ef" * 32, n=1, k=1)
    (folder / "commitment.json").write_bytes(commitment.canonical_json())
    save_file({"w": torch.tensor([1.0, float("nan")])}, str(folder / "extra.safetensors"))
    (folder / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    code, verdict = verify(folder)
    assert code == 1 and verdict["checks"] == ["integrity", "safety"]
    reasons = " | ".join(verdict["reasons"])
    assert "the commitment's final_sha256 is efefefefefef" in reasons
    assert "extra.safetensors" in reasons and "NaN" in reasons
    assert "broken.safetensors" in reasons
    assert "not json at all" not in reasons  # a reason never echoes the file's bytes


@pytest.mark.slow
def test_untrusted_compute_returning_a_protocol_0_pickle_as_notes_txt_is_rejected(tm_home, tmp_path, monkeypatch):
    import dataclasses

    from cli_invoke import run_cli, submitted
    from trainmaster.backends import registry

    harness = "untrusted_backend:PlainScriptExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    marker = tmp_path / "marker"
    script = f"""
        import os, pathlib, pickle, torch
        from safetensors.torch import save_file
        class Bomb:
            def __reduce__(self):
                return (pathlib.Path.touch, (pathlib.Path({str(marker)!r}),))
        out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
        save_file({{"w": torch.ones(2)}}, str(out / "model.safetensors"))
        (out / "notes.txt").write_bytes(pickle.dumps(Bomb(), protocol=0))
        (out / "log.txt").write_text("step 1 loss 0.5\\n")
    """
    spec = write_job(tmp_path / "job", script)
    policy = tmp_path / "untrusted.yaml"
    policy.write_text("name: untrusted\ndefault:\n  primary: bittensor\nverification:\n  untrusted: [integrity, safety]\n")
    result = run_cli("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    assert result.exit_code == 1, result.output
    job = submitted(result)
    [attempt] = job["attempts"]
    assert attempt["state"] == "rejected"
    assert "notes.txt is a pickle stream (protocol 0)" in job["reason"] and "log.txt" not in job["reason"]
    assert not marker.exists()


def test_a_tar_holding_a_link_or_past_its_member_limit_is_not_looked_into(tmp_path, monkeypatch):
    with tarfile.open(tmp_path / "linked.tar", "w") as archive:
        info = tarfile.TarInfo("secret")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(info)
    found = classify(tmp_path / "linked.tar")
    assert found.kind == UNCHECKED and "a link, device or FIFO (secret)" in found.what
    with tarfile.open(tmp_path / "many.tar", "w") as archive:
        for i in range(4):
            info = tarfile.TarInfo(f"log{i}.txt")
            info.size = 2
            archive.addfile(info, io.BytesIO(b"ok"))
    assert classify(tmp_path / "many.tar").kind == DATA
    monkeypatch.setattr(output_kinds, "MAX_MEMBERS", 3)
    found = classify(tmp_path / "many.tar")
    assert found.kind == UNCHECKED and "more than 3 members" in found.what


def test_the_untrusted_rule_says_unidentified_files_are_refused_too():
    rule = output_kinds.output_rule(False, "bittensor")
    assert "any protocol whatever the name" in rule and "not identified as safe" in rule and "REFUSED" in rule

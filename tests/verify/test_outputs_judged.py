"""Outputs judged per file, by content and by trust: real third-party-shaped jobs through the CLI.

pytorch/examples saves `.pt`, Hugging Face's Trainer leaves `training_args.bin`, `optimizer.pt` and
`rng_state.pth` beside `model.safetensors`, Stable-Baselines3 saves a zip with cloudpickle inside.
On trusted compute they are kept OPAQUE (recorded, never loaded, listed); from untrusted compute
they are refused with the file and how to convert; the spec's `outputs:` section drops sidecars.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from cli_invoke import run_cli, submitted
from conftest import write_job
from trainmaster.broker import paths
from trainmaster.jobs import outputs as kept_outputs
from trainmaster.jobs.spec import JobSpec, load_spec
from trainmaster.jobs.yamlfile import FileError
from trainmaster.verify import output_kinds
from trainmaster.verify.output_kinds import DATA, PICKLE, SAFETENSORS, UNCHECKED, classify


class Payload:
    """Unpickling this creates ``marker``: the proof that something was loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def sb3_zip(path: Path, marker: Path, *, with_pth: bool = True) -> Path:
    """A Stable-Baselines3 model archive, by hand: `data` is JSON whose `:serialized:` fields hold
    base64 cloudpickle (pickle bytes, the same format), `policy.pth` / `pytorch_variables.pth` are
    torch.save files, `_stable_baselines3_version` a version string."""
    data = {
        "policy_class": {":type:": "<class 'abc.ABCMeta'>",
                         ":serialized:": base64.b64encode(pickle.dumps(Payload(marker))).decode()},
        "learning_rate": 0.0003,
        "n_envs": 1,
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", json.dumps(data, indent=4))
        if with_pth:
            for name in ("policy.pth", "pytorch_variables.pth"):
                buffer = io.BytesIO()
                torch.save({"w": torch.ones(2)}, buffer)
                archive.writestr(name, buffer.getvalue())
        archive.writestr("_stable_baselines3_version", "2.3.2")
        archive.writestr("system_info.txt", "- OS: Linux\n")
    return path


# classification by content, never by loading


@pytest.mark.parametrize("name", ["model.pt", "model.zip", "model.weights", "x.sav", "notes.txt"])
def test_a_torch_save_file_is_pickle_capable_whatever_its_name(tmp_path, name):
    marker = tmp_path / "marker"
    torch.save({"w": torch.ones(2), "evil": Payload(marker)}, tmp_path / name)
    found = classify(tmp_path / name)
    assert found.kind == PICKLE and "torch.save archive" in found.what and "data.pkl" in found.what
    assert not marker.exists()


def test_a_zip_with_data_pkl_and_plain_pickles_are_pickle_capable(tmp_path):
    marker = tmp_path / "marker"
    with zipfile.ZipFile(tmp_path / "bundle.zip", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(Payload(marker)))
    assert classify(tmp_path / "bundle.zip").kind == PICKLE
    with zipfile.ZipFile(tmp_path / "renamed.zip", "w") as archive:
        archive.writestr("state", pickle.dumps({"a": 1}, protocol=4))  # found by its first bytes, not its name
    assert "state" in classify(tmp_path / "renamed.zip").what
    (tmp_path / "blob.dat").write_bytes(pickle.dumps(Payload(marker)))
    assert classify(tmp_path / "blob.dat").what.startswith("a pickle (protocol")
    assert not marker.exists()


@pytest.mark.parametrize("codec", ["zlib", "gzip", "bz2", "lzma"])
def test_a_compressed_pickle_is_pickle_capable(tmp_path, codec):
    """As joblib.dump(compress=…) writes it; big enough that the stream opens with a dynamic Huffman
    table (zlib, gzip) or a whole 900 kB block (bz2) before the pickle's first byte."""
    import importlib

    data = pickle.dumps({"w": np.random.default_rng(0).integers(0, 50, 300_000), "names": [str(i) for i in range(9000)]})
    (tmp_path / "model.joblib.z").write_bytes(importlib.import_module(codec).compress(data))
    assert classify(tmp_path / "model.joblib.z").what.startswith("a compressed pickle")
    (tmp_path / "log.gz").write_bytes(importlib.import_module(codec).compress(b"step 1 loss 0.5\n" * 10_000))
    assert classify(tmp_path / "log.gz").kind == DATA


@pytest.mark.parametrize("with_pth", [True, False])
def test_a_stable_baselines3_zip_is_pickle_capable(tmp_path, with_pth):
    marker = tmp_path / "marker"
    found = classify(sb3_zip(tmp_path / "ppo_cartpole.zip", marker, with_pth=with_pth))
    assert found.kind == PICKLE and "Stable-Baselines3" in found.what and "data" in found.what
    if with_pth:
        assert "policy.pth" in found.what
    assert not marker.exists()


def test_numpy_files_are_data_unless_they_hold_objects(tmp_path):
    # rl-zoo3's evaluations.npz: numeric arrays, which np.load reads without pickle
    np.savez(tmp_path / "evaluations.npz", timesteps=np.arange(3), results=np.ones((3, 5)))
    np.save(tmp_path / "returns.npy", np.zeros(4, dtype=np.float32))
    assert classify(tmp_path / "evaluations.npz").kind == DATA
    assert classify(tmp_path / "returns.npy").kind == DATA
    np.savez(tmp_path / "objects.npz", a=np.array([{"x": 1}], dtype=object))
    np.save(tmp_path / "objects.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    assert classify(tmp_path / "objects.npz").kind == PICKLE
    assert classify(tmp_path / "objects.npy").kind == PICKLE
    (tmp_path / "weights.npy").write_bytes(b"not numpy")
    assert classify(tmp_path / "weights.npy").kind == UNCHECKED


def test_other_files(tmp_path):
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07onnx")
    (tmp_path / "legacy.pkl").write_bytes(b"(dp0\nS'a'\np1\nI1\ns.")  # protocol 0: no magic, found by name
    with zipfile.ZipFile(tmp_path / "logs.zip", "w") as archive:
        archive.writestr("log.txt", "hello")
    with zipfile.ZipFile(tmp_path / "nested.zip", "w") as archive:
        archive.write(tmp_path / "logs.zip", "inner.zip")
    kinds = {name: classify(tmp_path / name).kind for name in
             ("model.safetensors", "metrics.jsonl", "model.onnx", "legacy.pkl", "logs.zip", "nested.zip")}
    assert kinds == {"model.safetensors": SAFETENSORS, "metrics.jsonl": DATA, "model.onnx": UNCHECKED,
                     "legacy.pkl": PICKLE, "logs.zip": DATA, "nested.zip": UNCHECKED}


def test_a_zip_announcing_too_many_members_is_not_listed(tmp_path):
    path = tmp_path / "bomb.zip"
    # a local header, then an end record claiming 65535 members in a 4 GB directory
    end = b"PK\x05\x06" + b"\0" * 4 + (65535).to_bytes(2, "little") * 2 + (0xFFFFFFF0).to_bytes(4, "little") + b"\0" * 6
    path.write_bytes(b"PK\x03\x04" + b"\0" * 26 + end)
    found = classify(path)
    assert found.kind == UNCHECKED and "over the limit" in found.what


# the outputs: rule


def test_outputs_rule_keeps_drops_and_caps():
    files = [("model.safetensors", 10), ("training_args.bin", 5), ("checkpoint-2/training_args.bin", 5),
             ("checkpoint-2/optimizer.pt", 50), ("logs/run.txt", 1)]
    rule = JobSpec(name="t", entrypoint="python t.py", outputs={"exclude": ["training_args.bin", "logs/"]}).outputs
    chosen = kept_outputs.select(files, rule)
    assert chosen.kept == ("model.safetensors", "checkpoint-2/optimizer.pt") and chosen.kept_bytes == 60
    assert chosen.dropped == ("training_args.bin", "checkpoint-2/training_args.bin", "logs/run.txt")
    only = JobSpec(name="t", entrypoint="python t.py", outputs={"include": ["*.safetensors"], "max_gb": 5e-9}).outputs
    chosen = kept_outputs.select(files, only)
    assert chosen.kept == ("model.safetensors",) and "over the spec's outputs.max_gb" in chosen.too_big


def test_outputs_section_errors_name_the_file_line_and_field(tmp_path):
    spec = write_job(tmp_path, "print()\n", "outputs:\n  exclde: [training_args.bin]\n")
    with pytest.raises(FileError, match=r"job.yaml:4: outputs.exclde: unknown field; did you mean 'exclude'"):
        load_spec(spec)
    spec = write_job(tmp_path, "print()\n", "outputs:\n  exclude: ['../secret']\n")
    with pytest.raises(FileError, match="outputs.exclude"):
        load_spec(spec)


def test_copy_tree_stores_outputs_once_by_hard_link_and_still_hashes_them(tmp_path):
    import asyncio
    import hashlib

    from trainmaster.backends import transfer

    source = tmp_path / "run"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "w.bin").write_bytes(b"w" * 100_000)
    linked = asyncio.run(transfer.copy_tree(source, tmp_path / "linked"))
    copied = asyncio.run(transfer.copy_tree(source, tmp_path / "copied", link=False))
    assert linked == copied and linked[0].sha256 == hashlib.sha256(b"w" * 100_000).hexdigest()
    original = (source / "sub" / "w.bin").stat()
    assert (tmp_path / "linked" / "sub" / "w.bin").stat().st_ino == original.st_ino
    assert (tmp_path / "copied" / "sub" / "w.bin").stat().st_ino != original.st_ino


# through the CLI on trusted compute (local)

PYTORCH_EXAMPLES = """
    # the end of pytorch/examples mnist/main.py, writing where trainmaster keeps outputs
    import os, torch
    model = torch.nn.Linear(4, 2)
    torch.save(model.state_dict(), os.path.join(os.environ["TRAINMASTER_OUTPUT_DIR"], "mnist_cnn.pt"))
"""

HF_TRAINER = """
    # what transformers.Trainer leaves: weights as safetensors, its state as torch.save files
    import os, pathlib, torch
    from safetensors.torch import save_file
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    model = torch.nn.Linear(4, 2)
    save_file(model.state_dict(), str(out / "model.safetensors"))
    torch.save({"output_dir": "out", "learning_rate": 5e-5}, out / "training_args.bin")
    checkpoint = out / "checkpoint-2"
    checkpoint.mkdir()
    torch.save(torch.optim.AdamW(model.parameters()).state_dict(), checkpoint / "optimizer.pt")
    torch.save({"python": 1, "torch": torch.get_rng_state()}, checkpoint / "rng_state.pth")
    save_file(model.state_dict(), str(checkpoint / "model.safetensors"))
"""


@pytest.mark.slow
def test_a_pytorch_examples_job_saving_pt_is_accepted_with_the_file_opaque(tm_home, tmp_path):
    spec = write_job(tmp_path / "mnist", PYTORCH_EXAMPLES)
    result = run_cli("submit", str(spec), "--wait", "--json")
    assert result.exit_code == 0, result.output
    job = submitted(result)
    [attempt] = job["attempts"]
    assert job["state"] == "accepted" and [f["path"] for f in attempt["outputs"]] == ["mnist_cnn.pt"]
    assert [(o["path"], o["kind"]) for o in attempt["opaque"]] == [("mnist_cnn.pt", "pickle")]
    verdict = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())
    assert verdict["evidence"]["safety"]["trust"] == "trusted"
    assert [o["path"] for o in verdict["evidence"]["safety"]["opaque"]] == ["mnist_cnn.pt"]
    status = run_cli("status", job["id"])
    assert status.exit_code == 0
    assert "opaque outputs" in status.output and "mnist_cnn.pt" in status.output
    assert "safetensors.torch.save_file(model.state_dict()" in status.output
    # stored once: the kept file is the run's own, hard-linked, not a second copy
    kept = paths.job_dir(job["id"]) / "outputs" / "mnist_cnn.pt"
    produced = paths.attempt_dir(job["id"], 1) / "outputs" / "mnist_cnn.pt"
    assert kept.stat().st_ino == produced.stat().st_ino and kept.stat().st_nlink == 2


@pytest.mark.slow
def test_an_hf_trainer_folder_is_accepted_and_a_sidecar_can_be_excluded(tm_home, tmp_path):
    spec = write_job(tmp_path / "hf", HF_TRAINER)
    job = submitted(run_cli("submit", str(spec), "--wait", "--json"))
    assert job["state"] == "accepted", job["reason"]
    [attempt] = job["attempts"]
    assert sorted(o["path"] for o in attempt["opaque"]) == [
        "checkpoint-2/optimizer.pt", "checkpoint-2/rng_state.pth", "training_args.bin"]

    spec = write_job(tmp_path / "hf-excluded", HF_TRAINER, "outputs:\n  exclude: [training_args.bin]\n")
    result = run_cli("submit", str(spec), "--wait", "--json")
    assert result.exit_code == 0, result.output
    job = submitted(result)
    [attempt] = job["attempts"]
    kept = [f["path"] for f in attempt["outputs"]]
    assert "training_args.bin" not in kept and "model.safetensors" in kept and "checkpoint-2/optimizer.pt" in kept
    assert not (paths.job_dir(job["id"]) / "outputs" / "training_args.bin").exists()
    assert sorted(o["path"] for o in attempt["opaque"]) == ["checkpoint-2/optimizer.pt", "checkpoint-2/rng_state.pth"]


@pytest.mark.slow
def test_an_empty_outputs_folder_fails_unless_outputs_are_optional(tm_home, tmp_path):
    spec = write_job(tmp_path / "empty", "open('result.txt', 'w').write('outside the outputs folder')\n")
    result = run_cli("submit", str(spec), "--wait", "--json")
    assert result.exit_code == 1
    job = submitted(result)
    assert job["state"] == "failed" and job["attempts"][0]["state"] == "rejected"
    # the reason leads with what went wrong, then says nothing else is left to try
    assert job["reason"].startswith("rejected: the run wrote no outputs")
    assert "outputs: {optional: true}" in job["reason"] and "no other backend is allowed by the policy" in job["reason"]
    assert "no offer can run" not in job["reason"]

    spec = write_job(tmp_path / "optional", "print('evaluated only')\n", "outputs:\n  optional: true\n")
    assert submitted(run_cli("submit", str(spec), "--wait", "--json"))["state"] == "accepted"


@pytest.mark.slow
def test_outputs_over_max_gb_fail_the_attempt_with_the_reason(tm_home, tmp_path):
    script = "import os\nopen(os.path.join(os.environ['TRAINMASTER_OUTPUT_DIR'], 'big.txt'), 'wb').write(b'x' * 5000)\n"
    spec = write_job(tmp_path / "big", script, "outputs:\n  max_gb: 0.000001\n")
    job = submitted(run_cli("submit", str(spec), "--wait", "--json"))
    assert job["state"] == "failed" and job["attempts"][0]["state"] == "failed"
    assert "over the spec's outputs.max_gb of 1e-06" in job["reason"]


def test_dry_run_states_the_rule_and_points_at_save_calls(tm_home, tmp_path):
    spec = write_job(tmp_path / "mnist", PYTORCH_EXAMPLES)
    result = run_cli("submit", str(spec), "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    warnings = json.loads(result.output)["warnings"]
    assert warnings[0].startswith("outputs on local (trusted compute)") and "OPAQUE" in warnings[0]
    assert any(w.startswith("train.py:5: torch.save(") and "may write a pickle-capable output" in w for w in warnings)
    shown = run_cli("submit", str(spec), "--dry-run")
    assert "train.py:5: torch.save(" in shown.output
    quiet = write_job(tmp_path / "quiet", "print('no saving here')  # torch.save( in a comment\n")
    assert len(json.loads(run_cli("submit", str(quiet), "--dry-run", "--json").output)["warnings"]) == 1


def test_the_untrusted_rule_says_refused_and_how_to_convert():
    rule = output_kinds.output_rule(False, "bittensor")
    assert "REFUSED" in rule and "model.policy.state_dict()" in rule
    lines = output_kinds.scan_sources({"train.py": "model = PPO('MlpPolicy', env)\nmodel.save('ppo')\nnp.save('a', x)\n"})
    assert lines == ["train.py:2: a .save( call (e.g. Stable-Baselines3's model.save writes a zip of cloudpickle): "
                     "model.save('ppo')"]


# `trainmaster verify DIR`: strict unless --trusted


def pickled_folder(root: Path, marker: Path) -> Path:
    root.mkdir()
    save_file({"w": torch.ones(2)}, str(root / "model.safetensors"))
    for name in ("model.zip", "model.weights", "x.sav"):
        torch.save({"w": torch.ones(1), "evil": Payload(marker)}, root / name)
    with zipfile.ZipFile(root / "pickles.zip", "w") as archive:
        archive.writestr("data.pkl", pickle.dumps(Payload(marker)))
    sb3_zip(root / "ppo_cartpole.zip", marker)
    return root


def test_verify_dir_refuses_pickles_by_default_and_keeps_them_opaque_when_trusted(tmp_path):
    marker = tmp_path / "marker"
    folder = pickled_folder(tmp_path / "outputs", marker)
    strict = run_cli("verify", str(folder), "--json")
    assert strict.exit_code == 1, strict.output
    [reason] = json.loads(strict.output)["reasons"]
    for name in ("model.zip is a torch.save archive", "model.weights is a torch.save archive",
                 "x.sav is a torch.save archive", "pickles.zip is a zip archive holding pickles (data.pkl)",
                 "ppo_cartpole.zip is a Stable-Baselines3 model archive"):
        assert name in reason
    assert "refused from untrusted compute" in reason and "safetensors.torch.save_file" in reason
    lenient = run_cli("verify", str(folder), "--trusted", "--json")
    assert lenient.exit_code == 0, lenient.output
    safety = json.loads(lenient.output)["evidence"]["safety"]
    assert sorted(o["path"] for o in safety["opaque"]) == [
        "model.weights", "model.zip", "pickles.zip", "ppo_cartpole.zip", "x.sav"]
    assert list(safety["safetensors_checked"]) == ["model.safetensors"]
    assert "--trusted keeps pickle-capable files opaque" in run_cli("verify", str(folder)).output
    shown = run_cli("verify", str(folder), "--trusted")
    assert "opaque (kept, never loaded" in shown.output and "x.sav: a torch.save archive" in shown.output
    assert not marker.exists()


def test_verify_dir_of_an_empty_folder_is_rejected(tmp_path):
    (tmp_path / "empty").mkdir()
    for extra in ([], ["--trusted"]):
        result = run_cli("verify", str(tmp_path / "empty"), *extra)
        assert result.exit_code == 1 and "the run wrote no outputs" in result.output


# untrusted compute through the broker


@pytest.mark.slow
def test_untrusted_compute_returning_a_pt_file_is_rejected_with_the_file_and_not_paid(tm_home, tmp_path, monkeypatch):
    import dataclasses

    from trainmaster.backends import registry

    harness = "untrusted_backend:PlainScriptExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    marker = tmp_path / "marker"
    script = f"""
        import os, pathlib, torch
        from safetensors.torch import save_file
        class Bomb:
            def __reduce__(self):
                return (pathlib.Path.touch, (pathlib.Path({str(marker)!r}),))
        out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
        save_file({{"w": torch.ones(2)}}, str(out / "model.safetensors"))
        torch.save({{"w": torch.ones(2), "bomb": Bomb()}}, out / "model.pt")
    """
    spec = write_job(tmp_path / "job", script)
    policy = tmp_path / "untrusted.yaml"
    policy.write_text("name: untrusted\ndefault:\n  primary: bittensor\nverification:\n  untrusted: [integrity, safety]\n")
    result = run_cli("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    assert result.exit_code == 1, result.output
    job = submitted(result)
    [attempt] = job["attempts"]
    assert attempt["backend"] == "bittensor" and attempt["state"] == "rejected"
    assert job["reason"].startswith("rejected: unsafe outputs: refused from untrusted compute")
    assert "model.pt is a torch.save archive" in job["reason"]
    assert "safetensors.torch.save_file(model.state_dict()" in job["reason"]
    assert "no other offer is left to try" in job["reason"] and "its executor is banned" in job["reason"]
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as ledger:
        assert [e.kind for e in ledger.entries() if e.job_id == job["id"]] == ["reserve", "release"]
    assert not marker.exists()

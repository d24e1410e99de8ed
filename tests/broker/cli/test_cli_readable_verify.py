"""`verify DIR` and the hint on pickle-capable outputs, through the real CLI (#16 §8): a folder's evidence
says what a folder is (no job id from its name, no "trusted executor" signature beside `trust: untrusted`,
no `outputs_checked: 0`); the hint on how to return checkable weights fits the framework that wrote the
files (a Hugging Face Trainer's gets the outputs.exclude patterns that work)."""

from __future__ import annotations

import hashlib
import json
import pickle

import torch

from cli_run import tm
from trainmaster.jobs.canonical import serialize
from trainmaster.jobs.commitment import Commitment

HF_LIKE = """\
import os, torch
out = os.environ["TRAINMASTER_OUTPUT_DIR"]
os.makedirs(os.path.join(out, "checkpoint-1"), exist_ok=True)
torch.save({"lr": 0.1}, os.path.join(out, "training_args.bin"))
torch.save({"state": {}}, os.path.join(out, "checkpoint-1", "optimizer.pt"))
"""
HF_EXCLUDE = 'outputs.exclude: ["training_args.bin", "checkpoint-*/"]'


def _committed_folder(root):
    outputs = root / "outputs"
    outputs.mkdir()
    data = serialize({"w": torch.ones(4)})
    (outputs / "model.safetensors").write_bytes(data)
    commitment = Commitment(job_id="job-7", bundle_sha256="ab" * 32, root="cd" * 32,
                            final_sha256=hashlib.sha256(data).hexdigest(), n=1, k=1)
    (outputs / "commitment.json").write_bytes(commitment.canonical_json())
    return outputs


def test_a_folders_evidence_says_it_is_a_folder(tm_home, tmp_path):
    outputs = _committed_folder(tmp_path)
    verdict = json.loads(tm("verify", str(outputs), "--json", home=tm_home).stdout)
    integrity, folder = verdict["evidence"]["integrity"], verdict["evidence"]["folder"]
    assert verdict["job_id"] == "job-7" and verdict["attempt_id"] is None  # the commitment's job, not the folder's name
    assert "trusted executor" not in integrity["signature"] and integrity["signature"].startswith("not checked: a folder")
    assert "outputs_checked" not in integrity and integrity["recorded_outputs"].startswith("none: a folder")
    assert folder == {"path": str(outputs.resolve()), "files": 2,
                      "judged_as": "untrusted compute's outputs (its origin is unknown)"}
    assert verdict["evidence"]["safety"]["trust"] == "untrusted"
    trusted = json.loads(tm("verify", str(outputs), "--trusted", "--json", home=tm_home).stdout)
    assert trusted["evidence"]["folder"]["judged_as"] == "trusted compute's outputs (--trusted)"


def test_a_folder_without_a_commitment_has_no_job_id(tm_home, tmp_path):
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "metrics.json").write_text('{"loss": 1}')
    verdict = json.loads(tm("verify", str(tmp_path / "outputs"), "--json", home=tm_home).stdout)
    assert verdict["job_id"] is None and verdict["evidence"]["integrity"]["commitment"] is None
    shown = tm("verify", str(tmp_path / "outputs"), home=tm_home).stdout
    assert shown.startswith(f"folder {(tmp_path / 'outputs').resolve()}: ACCEPTED"), shown


def test_a_hugging_face_trainers_files_get_its_exclude_patterns(tm_home, job_factory, tmp_path):
    job = json.loads(tm("submit", str(job_factory(HF_LIKE, "estimated_hours: 0.001\n")), "--wait", "--json",
                        home=tm_home).stdout)
    assert job["state"] == "accepted", job
    shown = " ".join(tm("status", job["id"], home=tm_home).stdout.split())
    assert HF_EXCLUDE in shown and "Stable-Baselines3" not in shown, shown
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "training_args.bin").write_bytes(pickle.dumps({"lr": 0.1}, protocol=2))
    refused = tm("verify", str(folder), home=tm_home)
    assert refused.returncode == 1 and "training_args.bin" in refused.stdout, refused.stdout
    assert HF_EXCLUDE in " ".join(refused.stdout.split()) and "Stable-Baselines3" not in refused.stdout, refused.stdout


def test_the_hint_follows_the_framework():
    from trainmaster.broker.cli.save_hints import GENERIC, save_hint

    assert "model.policy.state_dict()" in save_hint("ppo_cartpole.zip: a Stable-Baselines3 model archive")
    assert "lightning_module.state_dict()" in save_hint("epoch=3-step=90.ckpt: a torch.save file")
    assert HF_EXCLUDE in save_hint("checkpoint-500/optimizer.pt: a torch.save file")
    assert save_hint("weights.pt: a torch.save file") == GENERIC and "Stable-Baselines3" not in GENERIC

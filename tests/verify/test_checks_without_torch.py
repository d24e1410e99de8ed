"""A verification that replays nothing never imports torch: T comes from the shipped recipe's config without its
module (verify/recipe_run.py `recipe_config`, jobs/recipes/hyperparameters.py) and the final weights' header is
compared with the canonical one without torch (jobs/canonical_header.py). Before, every such check imported the
recipe's module and torch, ~2 s of CPU in each verification process. One that reads no tensor data (a plain job's
outputs) imports no numpy either. Each case runs in a fresh interpreter, which then reports what it imported."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from trainmaster.jobs.canonical import header_bytes, serialize
from trainmaster.jobs.canonical_header import header_for
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.recipes import MODULES, get_recipe, shipped_config
from trainmaster.jobs.spec import JobSpec
from trainmaster.verify.recipe_run import NotReplayable, recipe_config, recipe_run

K = 4
ENTRY = "python -m trainmaster.jobs.recipes.tiny_lm --steps 12 --d-model 16"

VERIFY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.verify.pipeline import Attempt, verify_attempt
    outputs, entry, k = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    spec = JobSpec(name="lm", entrypoint=entry, seed=3, checkpoint={"segment_steps": k})
    attempt = Attempt(job_id="j", attempt_id="a", outputs=outputs, bundle_sha256="ab" * 32, trusted=True, spec=spec)
    verdict = verify_attempt(attempt, checks={"integrity"}, write_verdict=False)
    print(json.dumps({"outcome": verdict.outcome, "reasons": verdict.reasons, "torch": "torch" in sys.modules}))
""")


def outputs(tmp_path, n: int, *, canonical: bool = True):
    folder = tmp_path / "outputs"
    folder.mkdir()
    data = serialize({"b": torch.zeros(2, dtype=torch.int64), "w": torch.ones(3, 4)})
    if not canonical:  # the same tensors, the header's keys in another order: not the canonical bytes
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        text = json.dumps(dict(reversed(list(header.items()))), separators=(",", ":")).encode()
        text += b" " * (size - len(text))
        data = data[:8] + text + data[8 + size :]
    (folder / "model.safetensors").write_bytes(data)
    commitment = Commitment(job_id="j", bundle_sha256="ab" * 32, root="cd" * 32,
                            final_sha256=hashlib.sha256(data).hexdigest(), n=n, k=K)
    (folder / "commitment.json").write_bytes(commitment.canonical_json())
    return folder


def verified(folder, entry: str = ENTRY) -> dict:
    done = subprocess.run([sys.executable, "-c", VERIFY, str(folder), entry, str(K)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_trusted_runs_checks_read_t_from_the_spec_and_pass_without_torch(tmp_path):
    found = verified(outputs(tmp_path, n=12 // K))
    assert found == {"outcome": "accepted", "reasons": [], "torch": False}, found


def test_a_commitment_to_another_n_than_the_specs_t_over_k_is_rejected_without_torch(tmp_path):
    found = verified(outputs(tmp_path, n=2))
    assert found == {"outcome": "rejected", "reasons": ["the commitment has n = 2 segments, the spec's T/k is 3"],
                     "torch": False}, found


def test_final_weights_whose_header_is_not_canonical_are_rejected_without_torch(tmp_path):
    found = verified(outputs(tmp_path, n=12 // K, canonical=False))
    assert found == {"outcome": "rejected", "torch": False, "reasons": [
        "model.safetensors is not in the canonical serialization, so its hash is not the committed weights hash"]}, found


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_shipped_recipes_config_is_the_one_its_module_trains_with(name):
    assert shipped_config(name).config_type is get_recipe(name).config_type
    assert shipped_config(name).name == get_recipe(name).name == name


@pytest.mark.parametrize("entry", [ENTRY, "python -m trainmaster.jobs.recipes.dqn", "python -m trainmaster.jobs.recipes.ppo --lr 0.01"])
def test_the_config_read_without_the_recipe_is_the_one_the_replay_uses(entry):
    spec = JobSpec(name="x", entrypoint=entry, seed=1, checkpoint={"segment_steps": K})
    assert recipe_config(spec) == recipe_run(spec).config


@pytest.mark.parametrize("entry, why", [
    ("python train.py", "does not run a recipe"),
    ("python -m trainmaster.jobs.recipes.nope", "not a known recipe module"),
    ("python -m trainmaster.jobs.recipes.tiny_lm --steps 0", "recipe options are invalid"),
])
def test_a_spec_without_a_valid_shipped_recipe_is_not_replayable_either_way(entry, why):
    spec = JobSpec(name="x", entrypoint=entry, seed=1, checkpoint={"segment_steps": K})
    for read in (recipe_config, recipe_run):
        with pytest.raises(NotReplayable, match=why):
            read(spec)


def test_the_torch_free_header_is_the_canonical_one():
    tensors = {"a": torch.zeros(0, 3), "b": torch.ones(2, dtype=torch.bfloat16), "c": torch.zeros(5, dtype=torch.bool),
               "d": torch.arange(6, dtype=torch.int16).reshape(2, 3)}
    codes = {"a": "F32", "b": "BF16", "c": "BOOL", "d": "I16"}
    assert header_for((name, codes[name], list(t.shape)) for name, t in tensors.items()) == header_bytes(tensors)


def test_the_torch_free_dtype_table_is_the_canonical_forms():
    from trainmaster.jobs.canonical import DTYPES
    from trainmaster.jobs.canonical_header import ITEM_SIZES

    assert {code: dtype.itemsize for dtype, code in DTYPES.items()} == ITEM_SIZES


PLAIN = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.verify.pipeline import TRUSTED_CHECKS, Attempt, verify_attempt
    spec = JobSpec(name="plain", entrypoint="python train.py")
    attempt = Attempt(job_id="j", attempt_id="a", outputs=Path(sys.argv[1]), bundle_sha256="ab" * 32, trusted=True,
                      spec=spec)
    verdict = verify_attempt(attempt, checks=TRUSTED_CHECKS, write_verdict=False)
    print(json.dumps({"outcome": verdict.outcome, "reasons": verdict.reasons, "numpy": "numpy" in sys.modules,
                      "torch": "torch" in sys.modules}))
""")


def test_a_plain_jobs_outputs_are_judged_without_numpy_or_torch(tmp_path):
    """A verification with no tensor data to read (a plain script's text outputs, an audit-pool worker's usual job)
    loads neither numpy nor torch: numpy alone was ~0.2 of the worker's 0.5 CPU-s."""
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"score": 1.0}')
    (folder / "notes.txt").write_text("trained\n")
    done = subprocess.run([sys.executable, "-c", PLAIN, str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"outcome": "accepted", "reasons": result["reasons"], "numpy": False, "torch": False}, result


def test_submit_wait_of_a_plain_job_verifies_it_without_loading_numpy(tmp_path, tm_home):
    """The same through the user's path: `trainmaster submit --wait` of a plain script, with Python's import log on
    (PYTHONPROFILEIMPORTTIME, which the CLI's audit-pool worker inherits and writes to the CLI's stderr). The job is
    accepted after its verification, and no process of the command imported numpy."""
    from cli_run import tm

    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text('import os, pathlib\n'
                                   '(pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"]) / "notes.txt").write_text("x")\n')
    (code / "job.yaml").write_text("name: plain\nentrypoint: python train.py\n")
    done = tm("submit", str(code / "job.yaml"), "--wait", "--json", home=tm_home,
              extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    job = json.loads(done.stdout[done.stdout.index("{"):])
    assert job["state"] == "accepted" and job["attempts"][-1]["state"] == "accepted", job
    imported = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "trainmaster.verify.pipeline" in imported  # the verification's imports are in the log
    assert not [name for name in imported if name == "numpy" or name.startswith("numpy.")], "numpy was imported"

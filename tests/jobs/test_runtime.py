"""The runtime on a toy recipe: settings, seeding, files and formats, commitment, determinism, bad input."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import Field

from trainmaster.jobs import environment
from trainmaster.jobs.canonical import CanonicalError, views
from trainmaster.jobs.chunks import file_digest
from trainmaster.jobs.checkpoint import CheckpointError, read_segment, segment_dir, segment_indices
from trainmaster.jobs.commitment import Commitment, CommitmentError, read_commitment, segment_leaves, segment_proof
from trainmaster.jobs.decisions import argmax_margin
from trainmaster.jobs.execution import StateError
from trainmaster.jobs.merkle import merkle_root, verify_inclusion
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.replay import replay_segment
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.jobs.seeding import capture_global_rng, derive_seed, restore_global_rng, seed_globals, step_generator
from trainmaster.jobs.settings import SettingsError
from trainmaster.jobs.state import TrainState, load_optimizer_state, module_state, optimizer_state, prefixed, scalar, section


class ToyConfig(RecipeConfig):
    steps: int = 12
    lr: float = 0.05
    bad_from: int = Field(-1, description="from this step on, the state holds a python object")


class ToyTrainer:
    """Linear regression, SGD with momentum; each step also up-weights its hardest example (a decision)."""

    def __init__(self, config: ToyConfig, seed: int):
        self.config = config
        torch.manual_seed(derive_seed(seed, 0, "init"))
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=0.9)
        self.steps_done = 0

    def step(self, ctx):
        x = torch.randn(8, 4, generator=ctx.generator("data"))
        y = x.sum(dim=1, keepdim=True)
        per_example = ((self.model(x) - y) ** 2).squeeze(1)
        hardest = ctx.decisions.decide("hardest", per_example.argmax(), 8, argmax_margin(per_example))
        jitter = 1 + 0.01 * torch.rand(())  # the global generator, re-seeded by the runtime each step
        loss = (per_example.mean() + per_example[hardest]) * jitter
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.steps_done += 1
        return {"loss": float(loss.detach())} if ctx.step % 2 else None

    def state(self):
        rest = {**prefixed("optimizer", optimizer_state(self.optimizer)), "steps_done": scalar(self.steps_done)}
        if 0 <= self.config.bad_from <= self.steps_done:
            rest["oops"] = object()
        return TrainState(weights=module_state(self.model), rest=rest)

    def load_state(self, state):
        self.model.load_state_dict(state.weights)
        load_optimizer_state(self.optimizer, section("optimizer", state.rest))
        self.steps_done = int(state.rest["steps_done"])

    def result(self):
        return {"steps_done": self.steps_done}


TOY = Recipe(name="toy", config_type=ToyConfig, build=ToyTrainer)


def settings_for(root: Path, **overrides) -> RuntimeSettings:
    fields = dict(job_id="job-7", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=3, segment_steps=4,
                  bundle_sha256="ab" * 32)
    return RuntimeSettings(**{**fields, **overrides})


# --- settings -----------------------------------------------------------------------------------


def test_settings_defaults_when_run_by_hand():
    s = RuntimeSettings.from_env({})
    assert (s.job_id, s.output_dir, s.checkpoint_dir, s.resume_from) == ("local", Path("outputs"), Path("outputs/checkpoints"), None)
    assert (s.seed, s.segment_steps, s.bundle_sha256, s.rank, s.is_writer) == (0, 25, "0" * 64, 0, True)


def test_settings_from_the_job_environment():
    env = environment.job_environment(job_id="j1", output_dir=Path("/o"), checkpoint_dir=Path("/c"), seed=9,
                                      segment_steps=10, bundle_sha256="AB" * 32, resume_from=Path("/c/x"))
    s = RuntimeSettings.from_env({**env, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (s.job_id, s.output_dir, s.checkpoint_dir, s.resume_from) == ("j1", Path("/o"), Path("/c"), Path("/c/x"))
    assert (s.seed, s.segment_steps, s.bundle_sha256) == (9, 10, "ab" * 32)
    assert (s.rank, s.world_size, s.local_rank, s.is_writer) == (1, 2, 1, False)
    assert RuntimeSettings.from_env({environment.RESUME_FROM: ""}).resume_from is None


def test_the_self_check_is_on_unless_the_spec_or_the_script_says_off():
    def env(**kw):
        return environment.job_environment(job_id="j1", output_dir=Path("/o"), checkpoint_dir=Path("/c"), seed=9,
                                           segment_steps=10, bundle_sha256="ab" * 32, **kw)

    assert env()[environment.SELFCHECK] == "1" and env(selfcheck=False)[environment.SELFCHECK] == "0"
    assert RuntimeSettings.from_env(env()).selfcheck and RuntimeSettings.from_env({}).selfcheck
    assert not RuntimeSettings.from_env(env(selfcheck=False)).selfcheck  # checkpoint.selfcheck: false
    assert not RuntimeSettings.from_env(env(), selfcheck=False).selfcheck  # the script's own opt-out wins
    assert not RuntimeSettings().selfcheck  # settings built by hand: off unless asked


@pytest.mark.parametrize(
    "env", [{environment.SEED: "x"}, {environment.SEGMENT_STEPS: "0"}, {environment.BUNDLE_SHA256: "abc"},
            {environment.SELFCHECK: "no"}]
)
def test_bad_settings_are_refused(env):
    with pytest.raises(SettingsError):
        RuntimeSettings.from_env(env)


# --- seeding ------------------------------------------------------------------------------------


def test_step_seed_is_the_documented_pure_function():
    digest = hashlib.sha256(b"trainmaster-step-seed-v1\x00" + struct.pack("<qq", 7, 123) + b"data").digest()
    assert derive_seed(7, 123, "data") == int.from_bytes(digest[:8], "little")
    assert len({derive_seed(7, 123, "data"), derive_seed(7, 124, "data"), derive_seed(8, 123, "data"),
                derive_seed(7, 123, "env")}) == 4
    a = torch.rand(5, generator=step_generator(7, 123, "data"))
    assert torch.equal(a, torch.rand(5, generator=step_generator(7, 123, "data")))


def test_global_generators_are_reseeded_per_step_and_their_state_round_trips():
    seed_globals(5, 10)
    first = (random.random(), np.random.rand(), torch.rand(()).item())
    saved = capture_global_rng()
    after = (random.random(), np.random.rand(), torch.rand(()).item())
    seed_globals(5, 10)
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == first
    restore_global_rng(saved)
    assert (random.random(), np.random.rand(), torch.rand(()).item()) == after


# --- a run's files --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    result = run(TOY, ToyConfig(steps=12), settings_for(root))
    return root, result


def spec_digest(data: bytes, chunk: int = 64 * 1024) -> str:
    """digest(F) as docs/runtime.md states it: sha256("trainmaster-chunks-v1\\0" ‖ u64le(len) ‖ MTH(chunks))."""
    pieces = [data[j : j + chunk] for j in range(0, len(data), chunk)]
    return hashlib.sha256(b"trainmaster-chunks-v1\x00" + struct.pack("<Q", len(data)) + merkle_root(pieces)).hexdigest()


def test_every_segment_is_on_disk_with_a_consistent_manifest(toy_run):
    root, _ = toy_run
    assert segment_indices(root / "ckpt") == [0, 1, 2, 3]
    for i in range(4):
        directory = segment_dir(root / "ckpt", i)
        loaded = read_segment(directory)  # verifies sizes, hashes, leaf and canonical form
        m = loaded.manifest
        assert (m.job_id, m.recipe, m.segment, m.step, m.k) == ("job-7", "toy", i, 4 * i, 4)
        raw = {name: (directory / name).read_bytes() for name in m.files}
        assert m.weights_sha256 == spec_digest(raw["weights.safetensors"])  # docs/runtime.md, "Leaf hash", written out
        assert m.rest_sha256 == hashlib.sha256(
            bytes.fromhex(spec_digest(raw["rest.safetensors"])) + bytes.fromhex(spec_digest(raw["decisions.safetensors"]))
        ).hexdigest()
        assert m.leaf == hashlib.sha256(bytes.fromhex(m.weights_sha256) + bytes.fromhex(m.rest_sha256)).hexdigest()
        assert int(loaded.state.rest["runtime/step"]) == 4 * i
        expected_trace = [f"step/{s:012d}/hardest" for s in range(4 * i, 4 * i + 4)] if i < 3 else []
        assert sorted(loaded.trace) == expected_trace
    assert not [p for p in (root / "ckpt" / "segments").iterdir() if p.name.startswith(".")]


def test_commitment_is_canonical_and_commits_to_every_leaf_and_the_final_weights(toy_run):
    root, result = toy_run
    data = (root / "out" / "commitment.json").read_bytes()
    commitment = read_commitment(root / "out" / "commitment.json")
    assert result.commitment == commitment
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert set(json.loads(data)) == {"job_id", "bundle_sha256", "root", "final_sha256", "n", "k", "format",
                                     "deterministic"}
    from trainmaster.jobs.devices import fingerprint

    assert commitment.deterministic == fingerprint("cpu") and commitment.deterministic.startswith("torch ")
    assert (commitment.job_id, commitment.bundle_sha256, commitment.n, commitment.k) == ("job-7", "ab" * 32, 3, 4)
    leaves = segment_leaves(root / "ckpt", 3)
    assert commitment.root == merkle_root(leaves).hex()
    model = (root / "out" / "model.safetensors").read_bytes()
    assert commitment.final_sha256 == hashlib.sha256(model).hexdigest()
    assert spec_digest(model) == read_segment(segment_dir(root / "ckpt", 3)).manifest.weights_sha256
    for i in range(4):
        proof = [bytes.fromhex(h) for h in segment_proof(root / "ckpt", 3, i)]
        assert verify_inclusion(leaves[i], i, 4, proof, bytes.fromhex(commitment.root))


def test_commitment_parsing_is_strict():
    good = Commitment(job_id="j", bundle_sha256="a" * 64, root="b" * 64, final_sha256="c" * 64, n=2, k=5)
    assert Commitment.from_json(good.canonical_json()) == good
    pretty = json.dumps(json.loads(good.canonical_json()), indent=1).encode()
    as_float = good.canonical_json().replace(b'"k":5', b'"k":5.0')
    upper = good.canonical_json().replace(b"a" * 64, b"A" * 64)
    for bad in (pretty, as_float, upper, good.canonical_json()[:-1]):
        with pytest.raises(CommitmentError):
            Commitment.from_json(bad)


def test_the_commitment_format_is_signed_and_a_later_one_refused():
    good = Commitment(job_id="j", bundle_sha256="a" * 64, root="b" * 64, final_sha256="c" * 64, n=2, k=5)
    assert good.canonical_json().startswith(b'{"bundle_sha256":"' + b"a" * 64 + b'","final_sha256":"' + b"c" * 64
                                            + b'","format":2,"job_id":"j"')
    for bad in (good.canonical_json().replace(b'"format":2', b'"format":3'),
                good.canonical_json().replace(b'"format":2,', b'')):
        with pytest.raises(CommitmentError, match="commitment format is not 2"):
            Commitment.from_json(bad)


def test_a_format_1_commitment_is_refused_with_the_reason():
    """Format 1 (whole-file sha256 leaves) is retired: its bytes are refused, saying why and what to do."""
    old = Commitment(job_id="j", bundle_sha256="a" * 64, root="b" * 64, final_sha256="c" * 64, n=2, k=5)
    data = old.canonical_json().replace(b'"format":2', b'"format":1')
    with pytest.raises(CommitmentError, match="format 1 is refused: .*cannot open one chunk.*re-run the job"):
        Commitment.from_json(data)


def test_metrics_and_result_files(toy_run):
    root, result = toy_run
    lines = [json.loads(line) for line in (root / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4, 6, 8, 10, 12]
    assert all(isinstance(line["loss"], float) for line in lines)
    written = json.loads((root / "out" / "result.json").read_text())
    assert written == result.result
    assert written["steps_done"] == 12 and written["final_sha256"] == result.commitment.final_sha256
    assert Path(written["final_checkpoint"]) == segment_dir(root / "ckpt", 3)


def test_only_rank_zero_writes(tmp_path):
    result = run(TOY, ToyConfig(steps=8), settings_for(tmp_path, rank=1, world_size=2))
    assert result.commitment is None and result.result == {"steps_done": 8}
    assert not (tmp_path / "out").exists() and not (tmp_path / "ckpt").exists()


# --- determinism and replay -----------------------------------------------------------------------


def test_same_seed_same_commitment_other_seed_another(toy_run, tmp_path):
    _, first = toy_run
    again = run(TOY, ToyConfig(steps=12), settings_for(tmp_path / "a"))
    other = run(TOY, ToyConfig(steps=12), settings_for(tmp_path / "b", seed=4))
    assert again.commitment == first.commitment
    assert other.commitment.root != first.commitment.root and other.commitment.final_sha256 != first.commitment.final_sha256


def test_replaying_each_segment_reproduces_the_next_state_bit_for_bit(toy_run):
    root, _ = toy_run
    for i in range(3):
        replayed = replay_segment(TOY, segment_dir(root / "ckpt", i), 4)
        following = read_segment(segment_dir(root / "ckpt", i + 1))
        assert replayed.weights_sha256 == following.manifest.weights_sha256
        assert replayed.state_rest_sha256 == following.manifest.files["rest.safetensors"].sha256
        assert file_digest(views(replayed.trace.to_tensors())) == read_segment(segment_dir(root / "ckpt", i)).manifest.files["decisions.safetensors"].sha256


def test_resume_in_process_continues_the_same_run(toy_run, tmp_path):
    root, first = toy_run
    partial = settings_for(tmp_path)
    run(TOY, ToyConfig(steps=12), partial)
    for late in (2, 3):  # as if the run had died during segment 2
        shutil.rmtree(segment_dir(tmp_path / "ckpt", late))
    resumed = run(TOY, ToyConfig(steps=12), settings_for(tmp_path, resume_from=tmp_path / "ckpt"))
    assert resumed.commitment == first.commitment
    assert (tmp_path / "out" / "metrics.jsonl").read_text() == (root / "out" / "metrics.jsonl").read_text()


def test_resume_from_another_attempts_checkpoint_dir(toy_run, tmp_path):
    root, first = toy_run
    shutil.copytree(root / "ckpt", tmp_path / "old")
    shutil.rmtree(segment_dir(tmp_path / "old", 3))
    resumed = run(TOY, ToyConfig(steps=12), settings_for(tmp_path, resume_from=segment_dir(tmp_path / "old", 2)))
    assert resumed.commitment == first.commitment
    assert segment_indices(tmp_path / "ckpt") == [0, 1, 2, 3]


# --- bad input ------------------------------------------------------------------------------------


def test_a_state_that_cannot_be_serialized_stops_the_run_and_keeps_earlier_segments(tmp_path):
    with pytest.raises(CanonicalError, match="'oops' is a object"):
        run(TOY, ToyConfig(steps=12, bad_from=8), settings_for(tmp_path))
    assert segment_indices(tmp_path / "ckpt") == [0, 1]  # segment 1 went to the writer just before S_2 failed
    for i in (0, 1):
        read_segment(segment_dir(tmp_path / "ckpt", i))


def _tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-3])


@pytest.mark.parametrize("damage", [_tamper, _truncate])
@pytest.mark.parametrize("name", ["weights.safetensors", "rest.safetensors", "decisions.safetensors"])
def test_resuming_from_a_damaged_checkpoint_is_refused(toy_run, tmp_path, damage, name):
    shutil.copytree(toy_run[0] / "ckpt", tmp_path / "ckpt")
    damage(segment_dir(tmp_path / "ckpt", 3) / name)
    with pytest.raises(CheckpointError, match="truncated|tampered"):
        run(TOY, ToyConfig(steps=12), settings_for(tmp_path, resume_from=tmp_path / "ckpt"))
    assert segment_indices(tmp_path / "ckpt") == [0, 1, 2, 3]


def test_resuming_with_another_config_or_seed_is_refused(toy_run, tmp_path):
    root, _ = toy_run
    for config, seed in ((ToyConfig(steps=12, lr=0.1), 3), (ToyConfig(steps=12), 4)):
        with pytest.raises(StateError, match="cannot resume"):
            run(TOY, config, settings_for(tmp_path, seed=seed, resume_from=root / "ckpt"))


def test_steps_must_be_a_multiple_of_k(tmp_path):
    with pytest.raises(SettingsError, match="multiple"):
        run(TOY, ToyConfig(steps=10), settings_for(tmp_path))

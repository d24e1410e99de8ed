"""The sampled tier: a freeze, a swap and a backdoor written at one interior boundary of an n = 100 run are
caught by the boundary checks, with the segment before the tampered boundary not drawn; honest runs pass."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainmaster.jobs.boundary_chunks import write_openings
from trainmaster.jobs.checkpoint import read_segment, segment_dir
from trainmaster.jobs.execution import build_trainer, full_state, restore
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.runtime import run
from trainmaster.jobs.settings import RuntimeSettings
from trainmaster.jobs.state import TrainState
from trainmaster.verify.boundaries import check_boundaries, spec_of

from tampered_runs import continue_from
from trainmaster.verify.recipe_run import RecipeRun

K, N, SEED, TAMPERED = 2, 100, 5, 60
CONFIG = {"steps": K * N, "d_model": 16, "heads": 2, "seq_len": 8, "batch_size": 2}
RECIPE = get_recipe("tiny-lm")
SEGMENTS = [0, 11, 23, 35, 47, 72, 84, 99]  # a challenge that does not draw segment TAMPERED − 1


def _train(root: Path, seed: int = SEED):
    settings = RuntimeSettings(job_id="b", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=seed,
                               segment_steps=K, bundle_sha256="0" * 64)
    return run(RECIPE, RECIPE.config(CONFIG), settings).commitment


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    root = tmp_path_factory.mktemp("honest")
    return root, _train(root)


@pytest.fixture(scope="module")
def other_seed(tmp_path_factory):
    root = tmp_path_factory.mktemp("other")
    _train(root, seed=SEED + 1)
    return root


def _spec():
    cfg = RECIPE.config(CONFIG)
    initial = full_state(build_trainer(RECIPE, cfg, SEED), RECIPE, cfg, SEED, 0)
    return spec_of(RecipeRun(RECIPE, cfg.model_dump(mode="json"), SEED, K), initial)


def _audit(root: Path, commitment, segments=SEGMENTS):
    write_openings(root / "ckpt", segments, root / "opened")
    return check_boundaries(commitment, root / "opened", segments, _spec())


def _continue_from(root: Path, state: TrainState, j: int):
    """The executor writes the tampered S_j, then trains honestly from it to the end, and commits."""
    return continue_from(root / "ckpt", RECIPE, RECIPE.config(CONFIG), state, j, n=N, k=K, seed=SEED, job_id="b")


def _tampered(honest, tmp_path, make):
    root, _ = honest
    shutil.copytree(root / "ckpt", tmp_path / "ckpt")
    state = make(read_segment(segment_dir(root / "ckpt", TAMPERED)).state, root)
    return tmp_path, _continue_from(tmp_path, state, TAMPERED)


def test_an_honest_run_passes_every_boundary_check(honest):
    root, commitment = honest
    report = _audit(root, commitment)
    assert report.passed, report.reasons
    assert report.boundaries == N + 1 and report.chunks >= 2 * (N + 1)
    checks = {m.check for m in report.measurements}
    assert {"exact runtime/step", "weight movement / k-step bound", "second moments v_{s+1}/v_s", "movement profile"} <= checks


def test_a_freeze_is_caught_at_its_boundary(honest, tmp_path):
    """S_60 := S_59 with its counters advanced (exact fields pass): no movement in segment 59."""

    def freeze(state, root):
        before = read_segment(segment_dir(root / "ckpt", TAMPERED - 1)).state
        rest = dict(before.rest)
        rest["runtime/step"] = state.rest["runtime/step"].clone()
        for name, t in state.rest.items():
            if name.endswith("/step") and "/state/" in name:
                rest[name] = t.clone()
        return TrainState(weights=dict(before.weights), rest=rest)

    root, commitment = _tampered(honest, tmp_path, freeze)
    report = _audit(root, commitment)
    assert not report.passed
    assert any(r.startswith(f"segment {TAMPERED - 1}: its weights moved") and "freeze" in r for r in report.reasons), report.reasons


def test_a_swap_to_another_seeds_model_is_caught(honest, other_seed, tmp_path):
    def swap(state, root):
        theirs = read_segment(segment_dir(other_seed / "ckpt", TAMPERED)).state
        return TrainState(weights=dict(theirs.weights), rest=dict(state.rest))

    root, commitment = _tampered(honest, tmp_path, swap)
    report = _audit(root, commitment)
    assert not report.passed
    assert any(r.startswith(f"segment {TAMPERED - 1}:") and "allow" in r for r in report.reasons), report.reasons


def test_a_backdoor_written_into_the_weights_is_caught(honest, tmp_path):
    """100 AdamW steps teaching 'after token 3, say 0' written into S_60, moments untouched."""

    def backdoor(state, root):
        cfg = RECIPE.config(CONFIG)
        trainer = build_trainer(RECIPE, cfg, SEED)
        restore(trainer, state)
        model = trainer.model
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        for _ in range(100):
            tokens = torch.randint(0, cfg.vocab, (8, cfg.seq_len))
            tokens[:, -1] = 3
            loss = F.cross_entropy(model(tokens)[:, -1], torch.zeros(8, dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
        weights = {name: t.detach().clone() for name, t in model.state_dict().items() if name in state.weights}
        return TrainState(weights={**state.weights, **weights}, rest=dict(state.rest))

    root, commitment = _tampered(honest, tmp_path, backdoor)
    report = _audit(root, commitment)
    assert not report.passed
    assert any(r.startswith(f"segment {TAMPERED - 1}:") for r in report.reasons), report.reasons


def test_a_chunk_that_does_not_match_its_digest_is_refused(honest, tmp_path):
    import base64
    import json

    root, commitment = honest
    write_openings(root / "ckpt", SEGMENTS, tmp_path)
    path = tmp_path / "chunks" / f"{TAMPERED:08d}.json"
    opening = json.loads(path.read_text())
    data = bytearray(base64.b64decode(opening["chunks"][0]["data"]))
    data[-1] ^= 1
    opening["chunks"][0]["data"] = base64.b64encode(bytes(data)).decode()
    path.write_text(json.dumps(opening))
    report = check_boundaries(commitment, tmp_path, SEGMENTS, _spec())
    assert not report.passed and any(f"boundary {TAMPERED}:" in r and "does not match its committed digest" in r for r in report.reasons)
    (tmp_path / "chunks" / f"{TAMPERED + 1:08d}.json").unlink()
    report = check_boundaries(commitment, tmp_path, SEGMENTS, _spec())
    assert any(f"boundary {TAMPERED + 1}: the executor did not open it" in r for r in report.reasons)


def test_a_rest_larger_than_the_layout_allows_is_refused_unread(honest, tmp_path):
    import json

    root, commitment = honest
    write_openings(root / "ckpt", SEGMENTS, tmp_path)
    path = tmp_path / "chunks" / f"{TAMPERED:08d}.json"
    opening = json.loads(path.read_text())
    opening["rest"]["length"] = 2**60  # a declared size that would make the checker walk for ever
    path.write_text(json.dumps(opening))
    spec = _spec()
    bounded = type(spec)(**{**spec.__dict__, "max_rest_bytes": 10**8})
    report = check_boundaries(commitment, tmp_path, SEGMENTS, bounded)
    assert any(f"boundary {TAMPERED}: its rest file is {2**60} bytes" in r for r in report.reasons), report.reasons

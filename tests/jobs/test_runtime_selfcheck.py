"""The runtime's end-of-run self-check (jobs/selfcheck.py) and runs of more than one process: a state
that misses what the next steps read fails the run by name; a state recorded by N > 1 processes is
refused by the replay and the audit with the reason, never replayed wrongly."""

from __future__ import annotations

import pytest
import torch

from trainmaster.jobs.checkpoint import read_segment, segment_dir
from trainmaster.jobs.commitment import read_commitment
from trainmaster.jobs.execution import StateError
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.replay import replay_segment
from trainmaster.jobs.runtime import RuntimeSettings, run
from trainmaster.jobs.selfcheck import SelfCheckError, locate
from trainmaster.jobs.state import TrainState


class CountConfig(RecipeConfig):
    steps: int = 8
    hidden: bool = False


class Counting:
    """Adds a batch from (seed, step) to each of 8 weight tensors; with ``hidden``, the batch also depends on a
    step counter kept out of state() (the kind of thing a DataLoader iterator is)."""

    def __init__(self, config: CountConfig, seed: int):
        self.hidden, self.calls = config.hidden, 0
        self.w = {f"w{i}": torch.zeros(3) for i in range(8)}

    def step(self, ctx):
        self.calls += 1
        for name, w in self.w.items():
            w += torch.randn(3, generator=ctx.generator(name)) + (self.calls if self.hidden else 0)

    def state(self):
        return TrainState(weights=self.w, rest={})

    def load_state(self, state):
        self.w = {name: t.clone() for name, t in state.weights.items()}

    def result(self):
        return {}


COUNTING = Recipe(name="counting", config_type=CountConfig, build=Counting)


def _settings(root, **overrides) -> RuntimeSettings:
    return RuntimeSettings(output_dir=root / "out", checkpoint_dir=root / "ckpt", segment_steps=2, **overrides)


def test_a_module_level_recipe_is_found_and_a_local_one_is_not():
    assert locate(COUNTING).module == __name__ and locate(COUNTING).attr == "COUNTING"
    assert locate(Recipe(name="local", config_type=CountConfig, build=Counting)) is None


def test_a_run_whose_state_captures_everything_passes_its_self_check(tmp_path):
    done = run(COUNTING, CountConfig(), _settings(tmp_path, selfcheck=True))
    assert done.commitment is not None and read_commitment(tmp_path / "out" / "commitment.json").n == 4


def test_a_hidden_counter_fails_the_self_check_naming_a_few_entries_then_how_many_more(tmp_path):
    with pytest.raises(SelfCheckError) as caught:
        run(COUNTING, CountConfig(hidden=True), _settings(tmp_path, selfcheck=True))
    assert str(caught.value) == "state() does not capture everything the next steps read: w0, w1, w2, w3, w4 and 3 more"
    assert not (tmp_path / "out" / "commitment.json").exists()  # nothing committed
    assert segment_dir(tmp_path / "ckpt", 4).is_dir()  # the segments stay, to look at


def test_a_recipe_no_fresh_process_can_import_fails_the_check_with_the_reason(tmp_path):
    local = Recipe(name="counting", config_type=CountConfig, build=Counting)
    with pytest.raises(SelfCheckError, match="not an attribute of a module a fresh process can import"):
        run(local, CountConfig(), _settings(tmp_path, selfcheck=True))
    run(local, CountConfig(), _settings(tmp_path / "off"))  # settings built by hand: no self-check unless asked


def test_a_state_of_two_processes_is_recorded_and_refused_by_replay_and_resume(tmp_path):
    run(COUNTING, CountConfig(), _settings(tmp_path, world_size=2, selfcheck=True))  # rank 0 of 2: no self-check
    state = read_segment(segment_dir(tmp_path / "ckpt", 1)).state
    assert int(state.rest["runtime/world_size"]) == 2
    with pytest.raises(StateError, match="trained by 2 processes .* cannot be replayed or audited"):
        replay_segment(COUNTING, segment_dir(tmp_path / "ckpt", 1), 2)
    with pytest.raises(StateError, match="processes"):
        run(COUNTING, CountConfig(), _settings(tmp_path, resume_from=tmp_path / "ckpt"))
    single = tmp_path / "single"
    run(COUNTING, CountConfig(), _settings(single))
    assert "runtime/world_size" not in read_segment(segment_dir(single / "ckpt", 1)).state.rest  # absent means one


def test_the_audit_refuses_states_of_two_processes_with_the_reason(tmp_path):
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.openings import LocalOpenings

    run(COUNTING, CountConfig(), _settings(tmp_path, world_size=2))
    report = run_audit(commitment=read_commitment(tmp_path / "out" / "commitment.json"),
                       openings=LocalOpenings(tmp_path / "ckpt"), segments=[0, 2], recipe=COUNTING,
                       config=CountConfig().model_dump(mode="json"), seed=0, trusted_exact=True)
    assert not report.passed
    assert all("trained by 2 processes" in reason for reason in report.reasons), report.reasons


SCRIPT = '''\
import sys
import torch
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.runtime import run
from trainmaster.jobs.state import TrainState


class Trainer:
    def __init__(self, config, seed):
        self.w = torch.zeros(2)

    def step(self, ctx):
        self.w += torch.randn(2, generator=ctx.generator("data"))

    def state(self):
        return TrainState(weights={"w": self.w}, rest={})

    def load_state(self, state):
        self.w = state.weights["w"].clone()

    def result(self):
        return {}


RECIPE = Recipe(name="inline", config_type=RecipeConfig, build=Trainer)
{start}
'''


@pytest.mark.slow
@pytest.mark.parametrize("guarded", [True, False])
def test_a_recipe_defined_in_the_script_is_checked_from_the_script(tmp_path, guarded):
    """`python train.py` whose RECIPE lives in train.py: the fresh process imports the script under another
    name; a script that trains at import is refused there, saying how to fix it."""
    import os
    import subprocess
    import sys

    start = "run(RECIPE, RecipeConfig(steps=4))"
    (tmp_path / "train.py").write_text(SCRIPT.replace("{start}", f'if __name__ == "__main__":\n    {start}' if guarded else start))
    env = {**os.environ, "TRAINMASTER_OUTPUT_DIR": str(tmp_path / "out"), "TRAINMASTER_SEGMENT_STEPS": "2"}
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    if guarded:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "out" / "commitment.json").exists()
    else:
        assert done.returncode != 0
        assert "run() was called while a recipe was being imported to replay it" in done.stderr, done.stderr

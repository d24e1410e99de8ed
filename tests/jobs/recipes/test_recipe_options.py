"""A recipe's options are parsed by the config model's types (jobs/recipes/options.py), by the job and the audit alike:
each kind of field, the shipped command lines as before, and a user recipe with a list and a choice submitted,
trained and replay-audited through `trainmaster submit --wait`."""

from __future__ import annotations

import enum
import json
import os
import re
import subprocess
import sys
import textwrap
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.recipes import MODULES, get_recipe
from trainmaster.jobs.recipes.options import OptionsError, parse_options, parser_for
from trainmaster.verify.recipe_run import NotReplayable, parse_config
from repo_paths import ROOT



class Act(enum.Enum):
    RELU = "relu"
    TANH = "tanh"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Optim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Literal["sgd", "adam"] = "sgd"
    momentum: float = 0.0


class KindsConfig(RecipeConfig):
    steps: int = Field(100, gt=0)
    lr: float = 0.1
    widths: list[int] = Field(default_factory=lambda: [64])
    pair: tuple[int, float] = (1, 2.0)
    act: Literal["relu", "tanh"] = "relu"
    order: Literal[1, 2] = 1
    mode: Act = Act.RELU
    level: Level = Level.LOW
    decay: float | None = 0.5
    name: str = "run"
    optim: Optim = Field(default_factory=Optim)
    shuffle: bool = False


KINDS = Recipe(name="kinds", config_type=KindsConfig, build=lambda config, seed: None)


class CheckedConfig(RecipeConfig):
    steps: int = 100
    warmup: int = 10

    @model_validator(mode="after")
    def _warmup_within_steps(self):
        if self.warmup > self.steps:
            raise ValueError("warmup is longer than the run")
        return self


def parsed(*words: str) -> dict:
    return parse_options(KINDS, words).model_dump(mode="json", exclude_defaults=True)


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["--steps", "200", "--lr", "1e-3"], {"steps": 200, "lr": 0.001}),
        (["--widths", "[64, 32]"], {"widths": [64, 32]}),
        (["--widths=[128]"], {"widths": [128]}),
        (["--pair", "[3, 0.5]"], {"pair": [3, 0.5]}),
        (["--act", "tanh"], {"act": "tanh"}),
        (["--order", "2"], {"order": 2}),
        (["--mode", "tanh"], {"mode": "tanh"}),
        (["--level", "2"], {"level": 2}),
        (["--decay", "null"], {"decay": None}),
        (["--decay", "0.25"], {"decay": 0.25}),
        (["--name", "null"], {"name": "null"}),  # a plain string field takes the word as it is
        (["--name", "123"], {"name": "123"}),
        (["--optim", '{"name": "adam", "momentum": 0.9}'], {"optim": {"name": "adam", "momentum": 0.9}}),
        (["--shuffle"], {"shuffle": True}),
        (["--shuffle", "yes"], {"shuffle": True}),
        (["--shuffle", "true", "--shuffle", "0"], {}),  # the last one wins, as on any command line
    ],
)
def test_each_kind_of_field_is_parsed_by_its_type(words, expected):
    assert parsed(*words) == expected


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--widths", "64"], "--widths: Input should be a valid array; written as JSON, e.g. --widths '[64]'"),
        (["--widths", "64,32"], "--widths: not valid JSON (Extra data); written as JSON, e.g. --widths '[64]'"),
        (["--widths", "[64, 'x']"], "--widths: not valid JSON"),
        (["--widths", '[64, "x"]'], "--widths.1: Input should be a valid integer"),
        (["--act", "gelu"], "--act: Input should be 'relu' or 'tanh'"),
        (["--order", "3"], "--order: Input should be 1 or 2"),
        (["--mode", "gelu"], "--mode: Input should be 'relu' or 'tanh'"),
        (["--decay", "none"], "--decay: Input should be a valid number"),
        (["--optim", '{"name": "rmsprop"}'], "--optim.name: Input should be 'sgd' or 'adam'"),
        (["--optim", '{"lr": 1}'], "--optim.lr: Extra inputs are not permitted"),
        (["--shuffle", "maybe"], "--shuffle: Input should be a valid boolean"),
        (["--steps", "2.5"], "--steps: Input should be a valid integer"),
        (["--lr", "fast"], "--lr: Input should be a valid number"),
        (["--steps", "0"], "--steps: Input should be greater than 0"),
        (["--bogus", "1"], "options the kinds recipe does not take: --bogus 1"),
        (["--step", "1"], "does not take: --step 1"),  # no abbreviations: a prefix is not the option
        (["-h"], "does not take: -h"),  # the audit's words never print help
    ],
)
def test_a_value_its_type_refuses_names_the_option(words, message):
    with pytest.raises(OptionsError) as caught:
        parse_options(KINDS, words)
    assert message in str(caught.value)


def test_a_check_of_the_whole_config_is_reported_as_the_recipe_words_it():
    checked = Recipe(name="checked", config_type=CheckedConfig, build=lambda config, seed: None)
    with pytest.raises(OptionsError, match="^Value error, warmup is longer than the run$"):
        parse_options(checked, ["--steps", "5", "--warmup", "20"])


def test_the_job_and_the_audit_read_the_same_config_from_the_same_words():
    words = ["--widths", "[8, 4]", "--act", "tanh", "--decay", "null", "--shuffle"]
    assert parse_config(KINDS, words) == parse_options(KINDS, words).model_dump(mode="json")
    with pytest.raises(NotReplayable, match="recipe options are invalid: --widths: Input should be a valid array"):
        parse_config(KINDS, ["--widths", "64"])


def test_the_environment_is_never_read(monkeypatch):
    for name in ("STEPS", "steps", "WIDTHS", "TRAINMASTER_STEPS"):
        monkeypatch.setenv(name, "7")
    assert parsed() == {}


def test_help_shows_json_fields_and_defaults():
    text = parser_for(KINDS, "kinds").format_help()
    assert "--widths JSON" in text and "(default [64])" in text and "--shuffle [SHUFFLE]" in text


# the shipped recipes' command lines, as the argparse types read them before


SHIPPED_LINE = re.compile(r"python -m trainmaster\.jobs\.recipes\.(\w+)((?: +--[a-z-]+[ =][^\s\"',)`\\]+)*)")


def _shipped_lines() -> set[tuple[str, tuple[str, ...]]]:
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "configs").rglob("*.yaml"),
             *(ROOT / "tests").rglob("*.py")]
    found = {(m[1], tuple(m[2].split())) for path in files for m in SHIPPED_LINE.finditer(path.read_text())}
    return {(module, words) for module, words in found if module in MODULES.values()}


def _as_before(recipe: Recipe, words: tuple[str, ...]) -> dict | None:
    """The config the former parser gave: each value converted by its field's annotation (int or float)."""
    fields = recipe.config_type.model_fields
    pairs = [word.split("=", 1) if "=" in word else None for word in words]
    flat = [part for pair, word in zip(pairs, words) for part in (pair or [word])]
    values = {}
    for option, text in zip(flat[::2], flat[1::2]):
        name = option[2:].replace("-", "_")
        if name not in fields:
            return None
        try:
            values[name] = fields[name].annotation(text)
        except ValueError:
            return None
    try:
        return recipe.config(values).model_dump(mode="json")
    except ValueError:
        return None


def test_the_shipped_command_lines_parse_as_before():
    lines = _shipped_lines()
    assert len(lines) >= 10, lines  # README, the examples and the tests' own lines
    names = {module: name for name, module in MODULES.items()}
    for module, words in sorted(lines):
        recipe = get_recipe(names[module])
        try:
            now = parse_options(recipe, words, module).model_dump(mode="json")
        except OptionsError:
            now = None
        assert now == _as_before(recipe, words), (module, words)


# end to end: submitted, trained, replay-audited


RECIPE = '''\
"""A job's own recipe whose config has a list (hidden widths) and a choice (the activation)."""
from typing import Literal

import torch
from pydantic import Field

from trainmaster.jobs.recipe import Recipe, RecipeConfig, StateRules
from trainmaster.jobs.state import (
    TrainState, load_optimizer_state, module_state, optimizer_rules, optimizer_state, prefixed, section,
)


class MlpConfig(RecipeConfig):
    lr: float = 0.05
    widths: list[int] = Field(default_factory=lambda: [16])
    act: Literal["relu", "tanh"] = "relu"


class MlpTrainer:
    def __init__(self, config, seed):
        torch.manual_seed(seed)
        sizes = [3, *config.widths]
        act = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh}[config.act]
        layers = [m for a, b in zip(sizes, sizes[1:]) for m in (torch.nn.Linear(a, b), act())]
        self.model = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=0.9)
        self.config = config

    def step(self, ctx):
        x = torch.randn(16, 3, generator=ctx.generator("data"))
        loss = ((self.model(x) - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def state(self):
        return TrainState(weights=module_state(self.model), rest=prefixed("optimizer", optimizer_state(self.optimizer)))

    def load_state(self, state):
        self.model.load_state_dict(state.weights)
        load_optimizer_state(self.optimizer, section("optimizer", state.rest))

    def result(self):
        shapes = [list(p.shape) for p in self.model.parameters()]
        return {"act": self.config.act, "widths": self.config.widths, "shapes": shapes}


RECIPE = Recipe(name="mlp", config_type=MlpConfig, build=MlpTrainer, rules=StateRules(fields=optimizer_rules("optimizer")))
'''

TRAIN = """\
import sys

from mlp import RECIPE
from trainmaster.jobs.recipes.cli import main

if __name__ == "__main__":
    sys.exit(main(RECIPE))
"""

JOB = """\
name: mlp
entrypoint: python train.py --steps 50 --widths '[8, 4]' --act tanh
recipe: mlp:RECIPE
seed: 3
checkpoint:
  segment_steps: 25
verification:
  replay_audit: always
"""


@pytest.mark.slow
def test_a_user_recipe_with_a_list_and_a_choice_is_trained_and_replay_audited(tm_home, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "mlp.py").write_text(RECIPE)
    (code / "train.py").write_text(TRAIN)
    (code / "job.yaml").write_text(textwrap.dedent(JOB))
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(code / "job.yaml"), "--wait",
                           "--json"], capture_output=True, text=True, timeout=280, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout[done.stdout.index("{"):])
    assert job["state"] == "accepted", job
    job_dir = tm_home / "jobs" / job["id"]
    verdict = json.loads((job_dir / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted" and "replay" in verdict["checks"], verdict
    assert [s["index"] for s in verdict["evidence"]["replay"]["segments"]] == [0, 1]
    result = json.loads((job_dir / "attempts" / "1" / "outputs" / "result.json").read_text())
    assert result["act"] == "tanh" and result["widths"] == [8, 4]
    assert result["shapes"] == [[8, 3], [8], [4, 8], [4], [1, 4], [1]]  # the network the command line names

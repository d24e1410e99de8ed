"""The contract between the runtime and a training script: a recipe builds a trainer; a trainer steps.

A :class:`Trainer` must make each step a pure function of its state and ``(seed, step)``: all
randomness comes from ``ctx.generator(stream)`` / ``ctx.rng(stream)`` (or the global generators,
which the runtime re-seeds before every step), and every data-dependent discrete choice goes
through ``ctx.decisions.decide``. ``state()`` must capture everything the next steps depend on.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import numpy as np
import torch

from . import lazy_dynamo
from .decisions import DecisionLog
from .recipe_config import RecipeConfig
from .seeding import step_generator, step_rng
from .state import TrainState

# Wherever a recipe trains (a run, a self-check, an audit's re-execution), its optimizer would import
# torch._dynamo to compile nothing: 1.5 CPU-s a process. Deferred until something compiles (lazy_dynamo.py).
lazy_dynamo.defer()


@dataclass(frozen=True)
class StepContext:
    """What one step may use: its index, the job seed, derived generators and the decision log."""

    seed: int
    step: int
    decisions: DecisionLog

    def generator(self, stream: str) -> torch.Generator:
        """A torch generator for ``stream`` at this step (a pure function of seed, step, stream)."""
        return step_generator(self.seed, self.step, stream)

    def rng(self, stream: str) -> np.random.Generator:
        """A numpy generator for ``stream`` at this step."""
        return step_rng(self.seed, self.step, stream)


class Trainer(Protocol):
    def step(self, ctx: StepContext) -> Mapping[str, float] | None:
        """Run one training step; return metrics to log for it, if any."""

    def state(self) -> TrainState:
        """The full state (views of live memory are fine). Names must not start with ``runtime/``."""

    def load_state(self, state: TrainState) -> None:
        """Restore what :meth:`state` returned."""

    def result(self) -> dict[str, Any]:
        """Summary figures for ``result.json`` (e.g. final mean return, final loss)."""


FieldRule = Literal["exact", "tolerance", "close", "reported"]
"""How a verifier compares one entry of the executor's S_{i+1} with its own re-execution's (docs/audit.md):

* ``exact``: bit for bit (counters, RNG states, environment and buffer contents, JSON entries);
* ``tolerance``: floats that accumulate over training like the weights (optimizer moments, target
  networks): ``‖X_exec − X_re‖ / ‖X_re − X_i‖`` over the group within its calibrated tolerance;
* ``close``: floats recomputed from the weights each step (losses, priorities, log-probs, values):
  ``‖X_exec − X_re‖ / ‖X_re‖`` within its calibrated tolerance; a NaN or ±Inf must be the
  re-execution's own (a sentinel such as DQN's ``last_loss = NaN`` before learning);
* ``reported``: figures the recipe reports and never reads back (the last batch's loss for metrics
  and ``result.json``): as ``close``, but within a fixed relative bound rather than a calibrated one.
  Nothing later in training depends on them, and one batch's loss is heavy-tailed between honest
  executors (catastrophic cancellation in TD errors), so a calibrated bound would only add false rejects.
"""
FIELD_RULES: tuple[str, ...] = get_args(FieldRule)


def _nothing(_config: Any) -> int:
    return 0


@dataclass(frozen=True)
class StateRules:
    """How each entry of a state's rest is audited, and how large a state and a trace may be.

    Nothing is taken on trust: an entry no pattern covers is refused by the audit. The runtime's
    own entries (``runtime/...``) are exact and need no rule here; the weights are compared by r.
    """

    fields: Mapping[str, FieldRule] = field(default_factory=dict)
    """Name pattern (``fnmatch``: ``*`` also spans ``/``) → rule; the first pattern that matches decides."""
    growth_bytes: Callable[[Any], int] = _nothing
    """Bytes the rest may hold beyond S_0's rest and the optimizer's moments, for a config (buffers that fill)."""
    decision_bytes: Callable[[Any], int] = _nothing
    """The most bytes one step's decisions take in a trace file, header entries included."""

    def __post_init__(self) -> None:
        if unknown := {rule for rule in self.fields.values() if rule not in FIELD_RULES}:
            raise ValueError(f"unknown field rules {sorted(unknown)}; known: {', '.join(FIELD_RULES)}")

    def rule(self, name: str) -> tuple[str, FieldRule] | None:
        """``(pattern, rule)`` of the first pattern matching ``name``, or None when none covers it."""
        for pattern, rule in self.fields.items():
            if fnmatch.fnmatchcase(name, pattern):
                return pattern, rule
        return None


@dataclass(frozen=True)
class Recipe:
    """A named way to build a trainer from its config and the job seed, and how its states are audited."""

    name: str
    config_type: type[RecipeConfig]
    build: Callable[[Any, int], Trainer]
    rules: StateRules = StateRules()

    def config(self, values: Mapping[str, Any]) -> RecipeConfig:
        """Validate hyperparameters (e.g. from a state or the command line) into this recipe's config."""
        return self.config_type.model_validate(dict(values))

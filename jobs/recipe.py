"""The contract between the runtime and a training script: a recipe builds a trainer; a trainer steps.

A :class:`Trainer` must make each step a pure function of its state and ``(seed, step)``: all
randomness comes from ``ctx.generator(stream)`` / ``ctx.rng(stream)`` (or the global generators,
which the runtime re-seeds before every step), and every data-dependent discrete choice goes
through ``ctx.decisions.decide``. ``state()`` must capture everything the next steps depend on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from .decisions import DecisionLog
from .seeding import step_generator, step_rng
from .state import TrainState


class RecipeConfig(BaseModel):
    """Hyperparameters of a recipe. Stored in every state, so a replay rebuilds the same trainer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    steps: int = Field(gt=0, description="total training steps T (a multiple of k)")
    threads: int = Field(1, ge=1, description="torch intra-op threads; a bit-exact replay needs the same")


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


@dataclass(frozen=True)
class Recipe:
    """A named way to build a trainer from its config and the job seed."""

    name: str
    config_type: type[RecipeConfig]
    build: Callable[[Any, int], Trainer]

    def config(self, values: Mapping[str, Any]) -> RecipeConfig:
        """Validate hyperparameters (e.g. from a state or the command line) into this recipe's config."""
        return self.config_type.model_validate(dict(values))

"""Running steps and assembling full states: shared by the training runtime and segment replay.

The runtime adds its own entries to ``rest`` under ``runtime/``: the step counter, the seed, the
recipe name and config (canonical JSON as uint8), the global RNG states, and the number of training
processes when it is not 1 (``world_size``; absent means one). With those a state file is
self-describing: a verifier can rebuild the trainer and re-execute from it alone — with one process
(a state of more processes is refused, by name, rather than replayed wrongly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .decisions import DecisionLog
from .recipe import Recipe, RecipeConfig, StepContext, Trainer
from .devices import prepare_determinism, seed_cuda
from .seeding import capture_global_rng, derive_seed, restore_global_rng, seed_globals
from .state import TrainState, json_tensor, prefixed, scalar, section, tensor_json

RUNTIME = "runtime"
NONDETERMINISTIC = "does not have a deterministic implementation"
"""What torch says of an op it cannot run deterministically (``devices.prepare_determinism``)."""
BUILD_STREAM = "build"


class StateError(ValueError):
    """A state that does not belong to the recipe, or lacks the runtime's entries."""


@dataclass(frozen=True)
class StateInfo:
    """The runtime's own entries of a state."""

    recipe: str
    config: dict[str, Any]
    seed: int
    step: int
    world_size: int = 1


def full_state(
    trainer: Trainer, recipe: Recipe, config: RecipeConfig, seed: int, step: int, world_size: int = 1
) -> TrainState:
    """The trainer's state plus the runtime's entries, ready to serialize."""
    state = trainer.state()
    if clash := [name for name in state.rest if name.startswith(RUNTIME + "/")]:
        raise StateError(f"trainer state names {clash[:3]} use the reserved prefix '{RUNTIME}/'")
    own = {
        "step": scalar(step),
        "seed": scalar(seed),
        "recipe.json": json_tensor(recipe.name),
        "config.json": json_tensor(config.model_dump(mode="json")),
        **prefixed("rng", capture_global_rng()),
        **({"world_size": scalar(world_size)} if world_size != 1 else {}),
    }
    return TrainState(weights=dict(state.weights), rest={**state.rest, **prefixed(RUNTIME, own)})


def state_info(state: TrainState, world_size: int | None = 1) -> StateInfo:
    """The runtime's entries of ``state``. It must have been trained by ``world_size`` processes (None:
    any): a replay runs one process, so a state of more is refused here, naming why."""
    own = section(RUNTIME, state.rest)
    try:
        info = StateInfo(
            recipe=tensor_json(own["recipe.json"]),
            config=tensor_json(own["config.json"]),
            seed=int(own["seed"]),
            step=int(own["step"]),
            world_size=int(own["world_size"]) if "world_size" in own else 1,
        )
    except (KeyError, ValueError) as exc:
        raise StateError(f"state lacks the runtime's entries: {exc}") from exc
    if world_size is not None and info.world_size != world_size:
        raise StateError(
            f"the state was trained by {info.world_size} processes (WORLD_SIZE), not {world_size}: a replay "
            "re-executes with one process, so a run of more than one cannot be replayed or audited"
        )
    return info


def restore(trainer: Trainer, state: TrainState) -> None:
    """Load a full state into a trainer built from the same recipe and config."""
    restore_global_rng(section(f"{RUNTIME}/rng", state.rest))
    rest = {name: t for name, t in state.rest.items() if not name.startswith(RUNTIME + "/")}
    trainer.load_state(TrainState(weights=dict(state.weights), rest=rest))


def run_step(trainer: Trainer, seed: int, step: int, decisions: DecisionLog) -> Mapping[str, float] | None:
    """Execute step ``step``: re-seed the global generators for it, then let the trainer step."""
    seed_globals(seed, step)
    decisions.begin_step(step)
    try:
        return trainer.step(StepContext(seed=seed, step=step, decisions=decisions))
    except RuntimeError as exc:
        if NONDETERMINISTIC not in str(exc):
            raise
        raise StateError(
            f"step {step}: {str(exc).splitlines()[0]} — on CUDA the runtime runs steps with deterministic kernels "
            "(torch.use_deterministic_algorithms), so that a segment replays bit for bit; use an operation that has one"
        ) from exc


def set_threads(config: RecipeConfig) -> None:
    """Pin torch's intra-op thread count (the reduction order, hence bit-exactness, depends on it)."""
    torch.set_num_threads(config.threads)


def build_trainer(recipe: Recipe, config: RecipeConfig, seed: int) -> Trainer:
    """Pin the thread count and, on a CUDA machine, deterministic fp32 kernels (``devices.prepare_determinism``);
    seed the global generators (CUDA's too) from the job seed; build the trainer.

    S_0 records the global generators' states, so they must not depend on what ran before.
    """
    set_threads(config)
    prepare_determinism()
    seed_globals(seed, 0, BUILD_STREAM)
    seed_cuda(derive_seed(seed, 0, BUILD_STREAM))
    return recipe.build(config, seed)

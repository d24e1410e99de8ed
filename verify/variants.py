"""Ways an executor can run one segment: honest-but-different ones, and cheats.

Calibration (:mod:`trainmaster.verify.calibrate`) measures the audit's distance r between what an
executor variant produces and what the verifier re-computes. Honest variants emulate other hardware
on a CPU (docs/protocol.md §5): another thread count (another reduction order), a one-ulp
nudge of every weight, a float64 executor. Cheats change what is computed: a lower learning rate
(the mildest, lr × 0.9), skipped steps, another seed's data, steps in another order, bf16 autocast
instead of the spec's fp32; or stop training through the optimizer's hyperparameters (eps = 1e30,
weight decay 0, maximize, other betas, lr ≈ 0) and let the states record them.

Everything goes through the runtime's public pieces (``Recipe.build``, ``restore``, ``run_step``,
``full_state``), so a variant runs the recipe's own training code; only the surroundings change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from trainmaster.jobs.decisions import DecisionLog, DecisionTrace
from trainmaster.jobs.devices import replay_kind
from trainmaster.jobs.execution import build_trainer, full_state, restore, run_step, state_info
from trainmaster.jobs.recipe import Recipe, RecipeConfig
from trainmaster.jobs.state import TrainState

_DTYPES = {"float64": torch.float64}


class Variant(BaseModel):
    """How an executor deviates from the verifier while running a segment (all off: the verifier)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    other_threads: bool = Field(False, description="run with 2 torch threads where the config says 1, else 1")
    nudge_ulp: bool = Field(False, description="move every float weight of S_i one ulp up first")
    compute_dtype: Literal["float64"] | None = Field(None, description="run the trainer's modules in this dtype")
    autocast_bf16: bool = Field(False, description="run every step under CPU bf16 autocast")
    lr_scale: float = Field(1.0, gt=0, description="multiply the config's lr")
    skip_every: int = Field(0, ge=0, description="skip every n-th step (0: none)")
    data_seed_offset: int = Field(0, description="draw every step's randomness from seed + offset")
    reverse_order: bool = Field(False, description="run the segment's steps last to first")
    param_groups: dict[str, Any] = Field(
        default_factory=dict,
        description="optimizer hyperparameters set after restoring S_i, e.g. eps = 1e30 (its states then record them)",
    )


VERIFIER = Variant(name="verifier")
HONEST_VARIANTS = (
    Variant(name="threads", other_threads=True),
    Variant(name="ulp", nudge_ulp=True),
    Variant(name="float64", compute_dtype="float64"),
)
"""Honest executors on a CPU: other hardware emulated (docs/protocol.md §5)."""
DEVICE_HONEST_VARIANTS = (
    Variant(name="device"),
    Variant(name="ulp", nudge_ulp=True),
    Variant(name="float64", compute_dtype="float64"),
)
"""Honest executors on a GPU: the plain run there (against a verifier on another device, the real
cross-device divergence), a one-ulp nudge and float64 (a GPU's kernels ignore the CPU thread count)."""


def honest_variants(executor: str = "cpu") -> tuple[Variant, ...]:
    """The honest variants of an executor on this kind of device."""
    return HONEST_VARIANTS if executor == "cpu" else DEVICE_HONEST_VARIANTS
MILDEST_CHEAT = Variant(name="lr_x0.9", lr_scale=0.9)
FREEZES = (
    Variant(name="eps_1e30", param_groups={"eps": 1e30}),
    Variant(name="weight_decay_0", param_groups={"weight_decay": 0.0}),
    Variant(name="maximize", param_groups={"maximize": True}),
    Variant(name="betas_0.5", param_groups={"betas": [0.5, 0.5]}),
    Variant(name="lr_x1e-12", lr_scale=1e-12),
)
"""Executors that stop training (or change it) through the optimizer's hyperparameters, which their
states then record: each must be refused naming the entry (``optimizer/param_groups.json``)."""
CHEATS = (
    MILDEST_CHEAT,
    Variant(name="skip_half", skip_every=2),
    Variant(name="wrong_data", data_seed_offset=1),
    Variant(name="reordered", reverse_order=True),
    Variant(name="bf16", autocast_bf16=True),
)


@dataclass(frozen=True)
class Execution:
    """What a variant reached after k steps from S_i: S_{i+1} (in the state's own dtypes) and its trace."""

    state: TrainState
    trace: DecisionTrace


def execute(recipe: Recipe, state: TrainState, k: int, variant: Variant = VERIFIER) -> Execution:
    """Run ``k`` steps from ``state`` the way ``variant`` does; the state names the config and seed.

    The resulting state records the state's own config (a cheat does not announce itself).
    """
    info = state_info(state)
    config = recipe.config(info.config)
    run_config = recipe.config(_scaled_lr(info.config, variant.lr_scale))
    with _threads_kept():
        trainer = build_trainer(recipe, run_config, info.seed)
        if variant.other_threads:
            torch.set_num_threads(_other_thread_count(config.threads))
        if variant.compute_dtype:
            _cast_modules(trainer, _DTYPES[variant.compute_dtype])
        restore(trainer, _nudged(state) if variant.nudge_ulp else state)
        _override_param_groups(trainer, variant.param_groups)
        log = DecisionLog()
        for step in _steps(info.step, k, variant):
            with _autocast(variant):
                run_step(trainer, info.seed + variant.data_seed_offset, step, log)
        end = _in_dtypes_of(full_state(trainer, recipe, config, info.seed, info.step + k).snapshot(), state)
        if variant.compute_dtype:
            end = _reloaded(recipe, config, info.seed, info.step + k, end)
    return Execution(end, log.trace)


def _other_thread_count(threads: int) -> int:
    """The honest "threads" variant's count: 2 where the config says 1, else 1."""
    return 2 if threads == 1 else 1


def _scaled_lr(config: Mapping[str, Any], scale: float) -> dict[str, Any]:
    if scale == 1.0:
        return dict(config)
    if "lr" not in config:
        raise ValueError("this recipe's config has no 'lr' field: the lr-scaling variant cannot run")
    return {**config, "lr": config["lr"] * scale}


@contextlib.contextmanager
def _threads_kept() -> Iterator[None]:
    """Building a trainer pins torch's thread count to the config's; give the caller its own back."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _autocast(variant: Variant) -> contextlib.AbstractContextManager:
    if variant.autocast_bf16:  # on the device the recipe computes on (a replay's, when one is set)
        return torch.autocast(replay_kind() or "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _steps(start: int, k: int, variant: Variant) -> list[int]:
    n = variant.skip_every
    steps = [s for j, s in enumerate(range(start, start + k)) if not n or j % n != n - 1]
    return steps[::-1] if variant.reverse_order else steps


def _override_param_groups(trainer: object, values: Mapping[str, Any]) -> None:
    """Set ``values`` in every param group of every optimizer the trainer holds (lists become tuples, as betas are)."""
    if not values:
        return
    optimizers = [value for value in vars(trainer).values() if isinstance(value, torch.optim.Optimizer)]
    if not optimizers:
        raise ValueError(f"{type(trainer).__name__} holds no optimizer whose param groups could be changed")
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group.update({key: tuple(v) if isinstance(v, list) else v for key, v in values.items()})


def _cast_modules(trainer: object, dtype: torch.dtype) -> None:
    """Cast every module the trainer holds, and make each cast its floating inputs to match."""
    modules = [value for value in vars(trainer).values() if isinstance(value, torch.nn.Module)]
    if not modules:
        raise ValueError(f"{type(trainer).__name__} holds no torch modules to run in {dtype}")
    for module in modules:
        module.to(dtype)
        for part in module.modules():  # every level: a trainer may call submodules directly (PPO's actor, critic)
            part.register_forward_pre_hook(_cast_inputs(dtype))


def _cast_inputs(dtype: torch.dtype):
    def hook(_module: torch.nn.Module, args: tuple) -> tuple:
        return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    return hook


def _nudged(state: TrainState) -> TrainState:
    """``state`` with every float weight moved one ulp towards +inf."""
    weights = {
        name: torch.nextafter(t, torch.full_like(t, float("inf"))) if t.is_floating_point() else t
        for name, t in state.weights.items()
    }
    return TrainState(weights=weights, rest=state.rest)


def _reloaded(recipe: Recipe, config: RecipeConfig, seed: int, step: int, state: TrainState) -> TrainState:
    """``state`` loaded into the spec's own trainer and captured again: entries S_i did not hold yet
    (optimizer moments created in the segment) get the dtypes the spec's model gives them."""
    trainer = build_trainer(recipe, config, seed)
    restore(trainer, state)
    return full_state(trainer, recipe, config, seed, step).snapshot()


def _in_dtypes_of(state: TrainState, like: TrainState) -> TrainState:
    """``state`` with every tensor that ``like`` also holds cast back to ``like``'s dtype."""

    def cast(tensors: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {
            name: t.to(reference[name].dtype) if name in reference and t.dtype != reference[name].dtype else t
            for name, t in tensors.items()
        }

    return TrainState(weights=cast(state.weights, like.weights), rest=cast(state.rest, like.rest))

"""The full training state as two flat tensor dicts, and helpers to flatten common objects into it.

A state is split the way the commitment hashes it: ``weights`` (the model that is returned and
compared by the verifier) and ``rest`` (everything else the next steps depend on: optimizer
moments, target networks, replay buffers, environment state, counters, RNG states). Trainers may
return views of live memory; whoever keeps a state takes a copy (the runtime serializes it at once,
``TrainState.snapshot`` copies the tensors).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .canonical import bounded_json, canonical_tensors

JsonValue = Any
MAX_JSON_BYTES = 1024 * 1024
"""The largest JSON state entry read back (configs, optimizer param groups: a few KiB)."""
MAX_JSON_DEPTH = 16
"""The deepest nesting a JSON state entry may have (param groups nest 3 levels; checked before parsing)."""


@dataclass
class TrainState:
    """``weights`` and ``rest``: flat ``name -> tensor`` dicts (see :mod:`trainmaster.jobs.canonical`)."""

    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    rest: dict[str, torch.Tensor] = field(default_factory=dict)

    def snapshot(self) -> TrainState:
        """A canonical deep copy, safe to keep while training goes on.

        Raises :class:`~trainmaster.jobs.canonical.CanonicalError` for an entry that cannot be
        serialized, so the error points at the step whose state it is.
        """
        return TrainState(weights=_copy(self.weights), rest=_copy(self.rest))

    def on_host(self) -> TrainState:
        """The state with every tensor on the CPU in canonical form: the same tensors where they already
        are (no copy), host copies of a GPU trainer's. What hashes and comparisons work on."""
        return TrainState(weights=canonical_tensors(self.weights), rest=canonical_tensors(self.rest))


def _copy(tensors: Mapping[str, object]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in canonical_tensors(tensors).items()}


def prefixed(prefix: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``{prefix + "/" + name: tensor}``."""
    return {f"{prefix}/{name}": tensor for name, tensor in tensors.items()}


def section(prefix: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries under ``prefix + "/"``, with the prefix stripped (inverse of :func:`prefixed`)."""
    start = prefix + "/"
    return {name[len(start) :]: tensor for name, tensor in tensors.items() if name.startswith(start)}


def json_tensor(value: JsonValue) -> torch.Tensor:
    """A JSON-able value as a uint8 tensor of its canonical JSON (sorted keys, no NaN)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return torch.frombuffer(bytearray(text.encode("ascii")), dtype=torch.uint8)


def tensor_json(tensor: torch.Tensor) -> JsonValue:
    """Inverse of :func:`json_tensor`, for state entries only it wrote.

    States come from executors, so the tensor must be 1-D uint8 of at most :data:`MAX_JSON_BYTES`,
    nest at most :data:`MAX_JSON_DEPTH` levels (checked before parsing), and be exactly the canonical
    JSON of its value (no padding, no other spelling). Anything else raises :class:`ValueError`.
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise ValueError(f"a JSON entry must be a 1-D uint8 tensor, not {_describe(tensor)}")
    if tensor.numel() > MAX_JSON_BYTES:
        raise ValueError(f"a JSON entry of {tensor.numel()} bytes is over the limit of {MAX_JSON_BYTES}")
    raw = tensor.detach().cpu().contiguous().numpy().tobytes()
    value = bounded_json(raw, max_depth=MAX_JSON_DEPTH, what="a JSON entry")
    if json_tensor(value).numpy().tobytes() != raw:
        raise ValueError("a JSON entry is not in canonical form (sorted keys, no spaces)")
    return value


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__


def scalar(value: int | float | bool) -> torch.Tensor:
    """A python number as a 0-d tensor: bool -> bool, int -> int64, float -> float64."""
    dtype = {bool: torch.bool, int: torch.int64, float: torch.float64}[type(value)]
    return torch.tensor(value, dtype=dtype)


def module_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A module's parameters and buffers (views, detached)."""
    return {name: tensor.detach() for name, tensor in module.state_dict().items()}


def load_module_state(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Load :func:`module_state` output back, requiring exactly the module's names."""
    module.load_state_dict(dict(tensors), strict=True)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """An optimizer's state dict, flattened: per-parameter tensors, and JSON for everything else."""
    full = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    extra: dict[str, JsonValue] = {}
    for param_id, entries in full["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state/{param_id}/{key}"] = value.detach()
            else:
                extra[f"{param_id}/{key}"] = value
    tensors["state_extra.json"] = json_tensor(extra)
    tensors["param_groups.json"] = json_tensor(full["param_groups"])
    return tensors


def optimizer_rules(prefix: str) -> dict[str, str]:
    """The audit's field rules (:class:`trainmaster.jobs.recipe.StateRules`) for an
    :func:`optimizer_state` stored under ``prefix``: step counts and JSON exact, moments like the weights."""
    moments = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")
    return {
        f"{prefix}/state/*/step": "exact",
        **{f"{prefix}/state/*/{moment}": "tolerance" for moment in moments},
        f"{prefix}/state_extra.json": "exact",
        f"{prefix}/param_groups.json": "exact",
    }


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, tensors: Mapping[str, torch.Tensor], *, scheduled: Collection[str] = ()
) -> None:
    """Load :func:`optimizer_state` output back into ``optimizer``, keeping its hyperparameters.

    ``optimizer`` was built from the job's config, so its param groups (lr, betas, eps, weight
    decay, maximize, ...) are the spec's: they are kept, never taken from the stored
    ``param_groups.json``, except the keys in ``scheduled``, which the trainer itself sets from the
    config before every step (a learning-rate schedule's ``lr``). A state whose stored values
    differ therefore does not survive a load and re-capture unchanged, which is how a verifier
    refuses it (:func:`trainmaster.jobs.replay.replay_state`).
    """
    state: dict[int, dict[str, Any]] = {}
    for name, tensor in section("state", tensors).items():
        param_id, key = name.split("/", 1)
        state.setdefault(int(param_id), {})[key] = tensor.clone()
    for name, value in tensor_json(tensors["state_extra.json"]).items():
        param_id, key = name.split("/", 1)
        state.setdefault(int(param_id), {})[key] = value
    stored = tensor_json(tensors["param_groups.json"])
    if not isinstance(stored, list) or len(stored) != len(optimizer.param_groups):
        raise ValueError(f"param_groups.json holds {_count(stored)} groups, the optimizer has {len(optimizer.param_groups)}")
    groups = [dict(group) for group in optimizer.state_dict()["param_groups"]]
    for group, saved in zip(groups, stored, strict=True):
        for key in scheduled:
            if isinstance(saved, dict) and key in saved:
                group[key] = saved[key]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def _count(value: object) -> str:
    return str(len(value)) if isinstance(value, list) else f"no list of (a {type(value).__name__})"

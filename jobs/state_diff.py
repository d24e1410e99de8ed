"""Comparing state entries bit for bit, and saying in words how one differs (a JSON entry: which key).

Entries may live on any device (a trainer's live state on a GPU, a state read from disk on the
CPU): two entries on different devices are compared as host copies, never by an operation that
mixes devices."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .state import JsonValue, tensor_json

Tensors = Mapping[str, torch.Tensor]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaN equals NaN of the same bits; -0.0 differs from 0.0), on any devices."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = on_one_device(a, b)
    return torch.equal(_bytes(a), _bytes(b))


def on_one_device(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` as they are when they share a device, else both as host copies."""
    if a.device == b.device:
        return a, b
    return a.detach().cpu(), b.detach().cpu()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def differing(found: Tensors, expected: Tensors) -> list[str]:
    """The names whose entries differ, or that only one side holds, sorted."""
    names = found.keys() | expected.keys()
    return sorted(n for n in names if n not in found or n not in expected or not same_bits(found[n], expected[n]))


def describe(name: str, found: Tensors, expected: Tensors) -> str:
    """How entry ``name`` of ``found`` differs from ``expected``'s, e.g. ``param_groups.json: [0].eps is 1e+30, not 1e-08``."""
    if name not in expected:
        return f"{name}: unexpected entry"
    if name not in found:
        return f"{name}: missing"
    a, b = found[name], expected[name]
    if name.endswith(".json"):
        try:
            path, mine, theirs = _json_difference(tensor_json(a), tensor_json(b), "")
        except ValueError as exc:
            return f"{name}: {exc}"
        return f"{name}: {path or 'the value'} is {_short(mine)}, not {_short(theirs)}"
    if a.dtype != b.dtype or a.shape != b.shape:
        return f"{name}: {a.dtype} {list(a.shape)}, not {b.dtype} {list(b.shape)}"
    a, b = on_one_device(a, b)
    count = int((_bytes(a) != _bytes(b)).sum())
    return f"{name}: differs ({count} bytes of {a.numel() * a.element_size()})"


def _json_difference(a: JsonValue, b: JsonValue, path: str) -> tuple[str, JsonValue, JsonValue]:
    """The first place two JSON values differ: ``(path, a's value there, b's)``."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(a.keys() | b.keys()):
            if a.get(key, _MISSING) != b.get(key, _MISSING):
                return _json_difference(a.get(key, _MISSING), b.get(key, _MISSING), f"{path}.{key}" if path else key)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _json_difference(x, y, f"{path}[{i}]")
    return path, a, b


class _Missing:
    def __repr__(self) -> str:
        return "absent"


_MISSING = _Missing()


def _short(value: JsonValue) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""Dropout whose masks are the same bits on every device: an integer hash of (seed, step, call, element).

``torch.nn.Dropout`` draws its mask from the default generator of the device it runs on: MT19937 on
a CPU, Philox on a GPU. Re-seeded from ``(seed, step)`` that is reproducible on one device, but a
GPU executor's masks and a CPU verifier's are unrelated, so a cross-device replay of a segment with
dropout diverges like a segment with other data (r ≈ O(1)) and an honest GPU run would fail its
audit on a CPU broker. :class:`HashDropout` draws each mask from a counter-based hash computed with
integer tensor operations, which are exact on every device::

    key   = derive_seed(seed, step, "dropout/<call>")       # call = 0, 1, … within the step
    x     = mix(mix((index + key_lo) mod 2³²) xor key_hi)  # index = the element's flat position
    keep  = x ≥ p · 2³²;   out = input · (keep · 1/(1 − p))

``mix`` is a 32-bit avalanche (xor-shift, multiply by odd constants below 2³¹, so every product fits
in int64). The element-wise product is exactly rounded on any IEEE device, so given the same input
a GPU and a CPU give the same output bits. Keys come from :class:`DropoutKeys`, started by the
trainer at each step (``keys.start(ctx.seed, ctx.step)``); the calls of a step are numbered in the
order the forward pass makes them, which is the same on every device.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .seeding import derive_seed

_M = 0xFFFFFFFF
_MULTIPLIERS = (0x7FEB352D, 0x2C1B3C6D)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche over int64 values in [0, 2³²), in place (each product stays below 2⁶³)."""
    x ^= x >> 16
    x *= _MULTIPLIERS[0]
    x &= _M
    x ^= x >> 15
    x *= _MULTIPLIERS[1]
    x &= _M
    x ^= x >> 16
    return x


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, key: int, device: torch.device | str) -> torch.Tensor:
    """The boolean mask of the elements kept by dropout ``p`` under ``key`` (a pure function of its arguments)."""
    x = torch.arange(math.prod(shape), dtype=torch.int64, device=device)
    x += key & _M
    x &= _M
    _mix(x)
    x ^= (key >> 32) & _M
    _mix(x)
    return (x >= int(p * 2**32)).reshape(shape)


def hash_dropout(x: torch.Tensor, p: float, key: int) -> torch.Tensor:
    """``x`` with each element zeroed with probability ``p`` (by :func:`keep_mask`) and the rest scaled by 1/(1−p)."""
    if p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    return x * (keep_mask(x.shape, p, key, x.device).to(x.dtype) * (1.0 / (1.0 - p)))


class DropoutKeys:
    """The keys of one step's dropout calls: restarted by the trainer before every step."""

    def __init__(self) -> None:
        self._seed, self._step, self._call = 0, 0, 0

    def start(self, seed: int, step: int) -> None:
        self._seed, self._step, self._call = seed, step, 0

    def next(self) -> int:
        key = derive_seed(self._seed, self._step, f"dropout/{self._call}")
        self._call += 1
        return key


class HashDropout(nn.Module):
    """A drop-in for ``nn.Dropout(p)`` whose masks are the same on every device (see the module docstring)."""

    def __init__(self, p: float, keys: DropoutKeys):
        super().__init__()
        self.p, self.keys = p, keys

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        return hash_dropout(x, self.p, self.keys.next())

    def extra_repr(self) -> str:
        return f"p={self.p}"

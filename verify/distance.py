"""The audit's distance: how far the executor's S_{i+1} weights are from the verifier's, relative to the update.

``r = max(0, ‖W_exec − W_re‖₂ − a) / ‖W_re − W_i‖₂`` over every floating-point weight, computed in
float64 (docs/protocol.md §4), ``a`` being :data:`ROUNDING_ULPS` ulp-norms ``‖ulp(W_re)‖₂`` (the
spacing of floats at each re-executed weight). Integer and bool weights (counters, masks) must
match exactly.

The allowance is for segments whose update is itself a few ulps: the last segment of a schedule
that decays to zero (tiny-lm's cosine at T = 10,000 moves the weights by 2.4 ulp-norms in its last
25 steps) differs between honest executors by one or two ulp-norms, which would be r ≈ 0.4 there
against ≈ 1e-4 mid-run. A few ulp-norms of divergence carry nothing an executor could gain by.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from .errors import VerificationError

Tensors = Mapping[str, torch.Tensor]
ROUNDING_ULPS = 4.0
"""Divergence forgiven outright, in ulp-norms of the re-executed weights (honest: ≤ 1.1 at the end of a
cosine schedule; mid-run honest divergence is tens of ulp-norms, a cheat's thousands)."""
MEASURABLE_ULPS = 400.0
"""A segment whose update is under this many ulp-norms cannot separate the mildest cheat (lr × 0.9
moves it by a tenth of the update) from rounding; calibration leaves such bases out."""


@dataclass(frozen=True)
class Distance:
    divergence: float
    """‖W_exec − W_re‖₂"""
    update: float
    """‖W_re − W_i‖₂: the segment's own update as the verifier computes it."""
    start_norm: float
    """‖W_i‖₂"""
    rounding: float = 0.0
    """‖ulp(W_re)‖₂: the spacing of floats at the re-executed weights."""

    @property
    def r(self) -> float:
        """(divergence − the rounding allowance) / update; 0 when both are 0 (a segment without updates,
        reproduced), inf when only the update is (no arithmetic on the weights leaves them bit-identical)."""
        if self.update > 0:
            return max(0.0, self.divergence - ROUNDING_ULPS * self.rounding) / self.update
        return 0.0 if self.divergence == 0 else math.inf

    @property
    def raw_r(self) -> float:
        """divergence / update without the rounding allowance: what calibration measures on measurable
        bases, so τ is set from the whole divergence and the allowance only ever loosens an audit."""
        if self.update > 0:
            return self.divergence / self.update
        return 0.0 if self.divergence == 0 else math.inf

    @property
    def measurable(self) -> bool:
        """Whether the update is large enough against rounding to tell the mildest cheat from an honest executor."""
        return self.update >= MEASURABLE_ULPS * self.rounding

    @property
    def relative_update(self) -> float:
        """‖W_re − W_i‖ / ‖W_i‖ (the update's size, for the update-norm sanity check)."""
        return self.update / self.start_norm if self.start_norm > 0 else math.inf


def weight_distance(start: Tensors, replayed: Tensors, executed: Tensors) -> Distance:
    """The distance between the executor's weights and the verifier's, both k steps after ``start``.

    Raises :class:`VerificationError` when the executor's weights are not the same tensors (names,
    shapes, dtypes) as the verifier's, or an integer weight differs.
    """
    _check_same_layout(replayed, executed)
    _check_same_layout(replayed, start)
    divergence = update = start_sq = rounding = 0.0
    for name, re in replayed.items():
        re, exe, w0 = re.cpu(), executed[name].cpu(), start[name].cpu()  # host copies: never a mix of devices
        if not re.is_floating_point():
            if not torch.equal(re, exe):
                raise VerificationError(f"the executor's non-float weight {name!r} differs from the re-execution")
            continue
        re64 = re.double()
        divergence += float((exe.double() - re64).square().sum())
        update += float((re64 - w0.double()).square().sum())
        start_sq += float(w0.double().square().sum())
        rounding += float((torch.nextafter(re, torch.full_like(re, math.inf)).double() - re64).square().sum())
    return Distance(math.sqrt(divergence), math.sqrt(update), math.sqrt(start_sq), math.sqrt(rounding))


def _check_same_layout(expected: Tensors, found: Tensors) -> None:
    if expected.keys() != found.keys():
        missing, extra = sorted(expected.keys() - found.keys()), sorted(found.keys() - expected.keys())
        raise VerificationError(f"weight names differ from the re-execution's: missing {missing[:3]}, extra {extra[:3]}")
    for name, tensor in expected.items():
        other = found[name]
        if other.dtype != tensor.dtype or other.shape != tensor.shape:
            raise VerificationError(
                f"weight {name!r} is {other.dtype} {list(other.shape)}, the re-execution's is {tensor.dtype} {list(tensor.shape)}"
            )

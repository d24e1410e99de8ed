"""Running mean and variance of a scalar stream (Welford), in float64 python numbers."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..state import scalar


class RunningMeanStd:
    def __init__(self, epsilon: float = 1e-8):
        self.count, self.mean, self.m2 = 0, 0.0, 0.0
        self.epsilon = epsilon

    def update(self, value: float) -> None:
        self.count += 1
        delta = value - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (value - self.mean)

    def std(self) -> float:
        """The population std (1 before any value), floored by ``sqrt(epsilon)``."""
        variance = self.m2 / self.count if self.count else 1.0
        return math.sqrt(variance + self.epsilon)

    def state(self) -> dict[str, torch.Tensor]:
        return {"count": scalar(self.count), "mean": scalar(self.mean), "m2": scalar(self.m2)}

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.count, self.mean, self.m2 = int(tensors["count"]), float(tensors["mean"]), float(tensors["m2"])

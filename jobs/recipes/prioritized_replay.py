"""A proportional prioritized replay buffer (Schaul et al. 2016) in float64 numpy.

Sampling is stratified inverse-CDF over ``p_i^alpha``: the batch's j-th draw falls uniformly in
the j-th of ``batch`` equal slices of the total priority. Because priorities depend on the
weights, the drawn indices are a data-dependent decision and go through the decision log. The
cumulative sum is recomputed per draw (sequential, so bit-reproducible) instead of kept in a sum
tree: at CartPole buffer sizes that costs tens of microseconds and there is no tree to capture.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from ..decisions import DecisionLog, interval_margin
from ..state import scalar


class PrioritizedReplay:
    def __init__(self, capacity: int, obs_dim: int, alpha: float):
        self.capacity, self.alpha = capacity, alpha
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.action = np.zeros(capacity, dtype=np.int64)
        self.reward = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.priority = np.zeros(capacity, dtype=np.float64)  # p_i ** alpha
        self.size = 0
        self.ptr = 0
        self.max_priority = 1.0

    @staticmethod
    def state_bytes(capacity: int, obs_dim: int) -> int:
        """The data bytes of :meth:`state` for a full buffer (obs and next obs, action, reward, terminated, priority)."""
        return capacity * (2 * obs_dim * 4 + 8 + 4 + 4 + 8)

    def add(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, terminated: bool) -> None:
        """Store a transition with the highest priority seen so far."""
        i = self.ptr
        self.obs[i], self.action[i], self.reward[i] = obs, action, reward
        self.next_obs[i], self.terminated[i] = next_obs, float(terminated)
        self.priority[i] = self.max_priority**self.alpha
        self.ptr = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch: int, beta: float, rng: np.random.Generator, decisions: DecisionLog) -> tuple[np.ndarray, np.ndarray]:
        """Indices (recorded as decision ``replay_indices``) and normalised importance-sampling weights."""
        cdf = np.cumsum(self.priority[: self.size])
        total = cdf[-1]
        points = (np.arange(batch) + rng.random(batch)) * (total / batch)
        own = np.minimum(np.searchsorted(cdf, points, side="right"), self.size - 1)
        margin = interval_margin(torch.from_numpy(cdf), torch.from_numpy(points))
        index = decisions.decide("replay_indices", torch.from_numpy(own), self.size, margin).numpy()
        weights = (self.size * self.priority[index] / total) ** -beta
        return index, weights / weights.max()

    def update(self, index: np.ndarray, td_error: np.ndarray, eps: float) -> None:
        """New priorities ``|td| + eps`` for the sampled transitions (the last write wins on repeats)."""
        raw = np.abs(td_error.astype(np.float64)) + eps
        self.priority[index] = raw**self.alpha
        self.max_priority = max(self.max_priority, float(raw.max()))

    def state(self) -> dict[str, torch.Tensor]:
        n = self.size
        return {
            "obs": torch.from_numpy(self.obs[:n]),
            "next_obs": torch.from_numpy(self.next_obs[:n]),
            "action": torch.from_numpy(self.action[:n]),
            "reward": torch.from_numpy(self.reward[:n]),
            "terminated": torch.from_numpy(self.terminated[:n]),
            "priority": torch.from_numpy(self.priority[:n]),
            "size": scalar(n),
            "ptr": scalar(self.ptr),
            "max_priority": scalar(self.max_priority),
        }

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        n = int(tensors["size"])
        for name in ("obs", "next_obs", "action", "reward", "terminated", "priority"):
            getattr(self, name)[:n] = tensors[name].numpy()
        self.size, self.ptr = n, int(tensors["ptr"])
        self.max_priority = float(tensors["max_priority"])

"""CartPole-v1 with a fully capturable state, and the episode bookkeeping the RL recipes share.

The captured environment state is ``env.unwrapped.state`` (float64 physics), the TimeLimit's
elapsed steps, ``steps_beyond_terminated``, and the current observation. Episodes are reset with a
seed derived from ``(job seed, step)``, so the environment's own RNG never needs capturing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium.wrappers import TimeLimit

from ..seeding import derive_seed
from ..state import scalar

ENV_ID = "CartPole-v1"
RECENT = 20  # episodes averaged for the reported mean return
OBS_DIM = 4  # CartPole-v1's observation: position, velocity, angle, angular velocity
GROWTH_BYTES = RECENT * 8
"""How far the state grows past its start: the recent returns (float64), once RECENT episodes ended."""


@dataclass(frozen=True)
class Transition:
    obs: np.ndarray
    action: int
    reward: float
    next_obs: np.ndarray
    terminated: bool
    finished: bool  # terminated or truncated: the next obs starts a new episode


def _time_limit(env: gym.Env) -> TimeLimit:
    while not isinstance(env, TimeLimit):
        env = env.env
    return env


class CartPole:
    """One CartPole-v1 environment plus its current observation and episode statistics."""

    def __init__(self, seed: int):
        self.env = gym.make(ENV_ID)
        self.obs, _ = self.env.reset(seed=derive_seed(seed, 0, "env-init"))
        self.episode_return = 0.0
        self.episode_length = 0
        self.episodes = 0
        self.recent: list[float] = []

    @property
    def n_actions(self) -> int:
        return int(self.env.action_space.n)

    def step(self, action: int, seed: int, step: int) -> tuple[Transition, dict[str, float]]:
        """Act; on an episode's end reset with a seed from ``(seed, step)`` and report the episode."""
        next_obs, reward, terminated, truncated, _ = self.env.step(action)
        transition = Transition(self.obs, action, float(reward), next_obs, bool(terminated), terminated or truncated)
        self.episode_return += float(reward)
        self.episode_length += 1
        self.obs = next_obs
        if not transition.finished:
            return transition, {}
        finished = {"episode_return": self.episode_return, "episode_length": self.episode_length}
        self.episodes += 1
        self.recent = (self.recent + [self.episode_return])[-RECENT:]
        self.episode_return, self.episode_length = 0.0, 0
        self.obs, _ = self.env.reset(seed=derive_seed(seed, step, "env-reset"))
        return transition, finished

    def mean_recent_return(self) -> float:
        return float(np.mean(self.recent)) if self.recent else 0.0

    def state(self) -> dict[str, torch.Tensor]:
        beyond = self.env.unwrapped.steps_beyond_terminated
        return {
            "physics": torch.from_numpy(np.asarray(self.env.unwrapped.state, dtype=np.float64)),
            "elapsed_steps": scalar(int(_time_limit(self.env)._elapsed_steps)),
            "steps_beyond_terminated": scalar(-1 if beyond is None else int(beyond)),
            "obs": torch.from_numpy(np.asarray(self.obs, dtype=np.float32)),
            "episode_return": scalar(self.episode_return),
            "episode_length": scalar(self.episode_length),
            "episodes": scalar(self.episodes),
            "recent_returns": torch.tensor(self.recent, dtype=torch.float64),
        }

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        unwrapped = self.env.unwrapped
        unwrapped.state = tensors["physics"].numpy().astype(np.float64)
        beyond = int(tensors["steps_beyond_terminated"])
        unwrapped.steps_beyond_terminated = None if beyond < 0 else beyond
        _time_limit(self.env)._elapsed_steps = int(tensors["elapsed_steps"])
        self.obs = tensors["obs"].numpy().astype(np.float32)
        self.episode_return = float(tensors["episode_return"])
        self.episode_length = int(tensors["episode_length"])
        self.episodes = int(tensors["episodes"])
        self.recent = tensors["recent_returns"].tolist()

"""Double DQN with dueling heads and prioritized replay on CartPole-v1.

One environment step per training step; from ``learning_starts`` on, one gradient step every
``train_every`` steps. Soft (Polyak) target updates, Huber loss weighted by importance-sampling
weights (beta annealed 0.4 -> 1 over the run), gradient-norm clipping, linear epsilon decay.
Decisions recorded per step: ``action``, and on learning steps ``replay_indices`` and ``a_star``
(the Double-DQN target argmax over the batch).

    python -m trainmaster.jobs.recipes.dqn --steps 10000
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..decisions import argmax_margin, entry_bytes
from ..devices import resolve_device
from ..recipe import Recipe, StateRules, StepContext
from ..seeding import derive_seed
from ..state import (
    TrainState,
    load_module_state,
    load_optimizer_state,
    module_state,
    optimizer_rules,
    optimizer_state,
    prefixed,
    scalar,
    section,
)
from . import cli
from .hyperparameters import DQNConfig
from .cartpole import GROWTH_BYTES, OBS_DIM, CartPole
from .prioritized_replay import PrioritizedReplay


class DuelingQ(nn.Module):
    """Q(s, a) = V(s) + A(s, a) - mean_a A(s, a) over a shared MLP body."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.value = nn.Linear(hidden, 1)
        self.advantage = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = self.body(obs)
        advantage = self.advantage(h)
        return self.value(h) + advantage - advantage.mean(dim=-1, keepdim=True)


class DQNTrainer:
    def __init__(self, config: DQNConfig, seed: int):
        self.config = config
        self.env = CartPole(seed)
        obs_dim = self.env.obs.shape[0]
        self.device = resolve_device(config.device)
        torch.manual_seed(derive_seed(seed, 0, "init"))
        self.online = DuelingQ(obs_dim, self.env.n_actions, config.hidden).to(self.device)  # W0 drawn on the CPU
        self.target = DuelingQ(obs_dim, self.env.n_actions, config.hidden).to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.params = list(self.online.parameters())
        self.target_params = list(self.target.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=config.lr, foreach=True)
        self.buffer = PrioritizedReplay(config.buffer_size, obs_dim, config.alpha)
        self.last_loss = float("nan")

    def epsilon(self, step: int) -> float:
        c = self.config
        progress = min(1.0, step / (c.eps_fraction * c.steps))
        return c.eps_start + progress * (c.eps_end - c.eps_start)

    def beta(self, step: int) -> float:
        return self.config.beta_start + (1.0 - self.config.beta_start) * step / self.config.steps

    def step(self, ctx: StepContext) -> Mapping[str, float]:
        action = self._act(ctx)
        transition, metrics = self.env.step(action, ctx.seed, ctx.step)
        self.buffer.add(transition.obs, action, transition.reward, transition.next_obs, transition.terminated)
        c = self.config
        if ctx.step >= c.learning_starts and ctx.step % c.train_every == 0:
            self.last_loss = self._learn(ctx)
        if metrics:
            metrics = {**metrics, "epsilon": self.epsilon(ctx.step), "loss": self.last_loss}
        return metrics

    def _act(self, ctx: StepContext) -> int:
        """Epsilon-greedy; the exploration coin and random action come from the step's own RNG."""
        rng = ctx.rng("explore")
        if rng.random() < self.epsilon(ctx.step):
            own, margin = torch.tensor(int(rng.integers(self.env.n_actions))), None
        else:
            with torch.no_grad():
                q = self.online(torch.from_numpy(self.env.obs).to(self.device))
            own, margin = q.argmax(), argmax_margin(q)
        return int(ctx.decisions.decide("action", own, self.env.n_actions, margin))

    def _learn(self, ctx: StepContext) -> float:
        c = self.config
        index, weights = self.buffer.sample(c.batch_size, self.beta(ctx.step), ctx.rng("replay"), ctx.decisions)
        b, to = self.buffer, self._to_device
        obs, next_obs = to(b.obs[index]), to(b.next_obs[index])
        action, reward, terminated = to(b.action[index]), to(b.reward[index]), to(b.terminated[index])
        with torch.no_grad():
            next_q = self.online(next_obs)
            a_star = ctx.decisions.decide("a_star", next_q.argmax(dim=1), self.env.n_actions, argmax_margin(next_q))
            next_value = self.target(next_obs).gather(1, a_star.unsqueeze(1)).squeeze(1)
            target = reward + c.gamma * (1.0 - terminated) * next_value
        q = self.online(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        loss = (to(weights).float() * F.smooth_l1_loss(q, target, reduction="none")).mean()
        for group in self.optimizer.param_groups:  # the spec's value, whatever a state file says
            group["lr"] = c.lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.params, c.grad_clip, foreach=True)
        self.optimizer.step()
        self.buffer.update(index, (target - q).detach().cpu().numpy(), c.priority_eps)
        with torch.no_grad():
            torch._foreach_lerp_(self.target_params, self.params, c.tau)
        return float(loss.detach())

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def state(self) -> TrainState:
        return TrainState(
            weights=module_state(self.online),
            rest={
                **prefixed("target", module_state(self.target)),
                **prefixed("optimizer", optimizer_state(self.optimizer)),
                **prefixed("replay", self.buffer.state()),
                **prefixed("env", self.env.state()),
                "last_loss": scalar(self.last_loss),
            },
        )

    def load_state(self, state: TrainState) -> None:
        load_module_state(self.online, state.weights)
        load_module_state(self.target, section("target", state.rest))
        load_optimizer_state(self.optimizer, section("optimizer", state.rest))
        self.buffer.load_state(section("replay", state.rest))
        self.env.load_state(section("env", state.rest))
        self.last_loss = float(state.rest["last_loss"])

    def result(self) -> dict[str, float | int | None]:
        return {
            "mean_return_last_20": self.env.mean_recent_return(),
            "episodes": self.env.episodes,
            "final_loss": self.last_loss if math.isfinite(self.last_loss) else None,
        }


RULES = StateRules(
    fields={
        "target/*": "tolerance",  # Polyak-averaged weights
        **optimizer_rules("optimizer"),
        "replay/priority": "close",  # |TD error| of the transitions the segment sampled, from its weights
        "replay/max_priority": "close",
        "replay/*": "exact",  # transitions: what the recorded actions produce
        "env/*": "exact",
        "last_loss": "reported",  # NaN until learning starts
    },
    growth_bytes=lambda c: PrioritizedReplay.state_bytes(c.buffer_size, OBS_DIM) + GROWTH_BYTES,
    decision_bytes=lambda c: entry_bytes(1) + 2 * entry_bytes(c.batch_size),  # action, replay_indices, a_star
)

RECIPE = Recipe(name="dqn", config_type=DQNConfig, build=DQNTrainer, rules=RULES)

if __name__ == "__main__":
    sys.exit(cli.main(RECIPE, "dqn"))

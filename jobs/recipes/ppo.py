"""Clipped PPO with GAE on CartPole-v1, rewards scaled by a running std of the discounted return.

One training step is one environment step (``global_step`` counts them and is reported in the
metrics and stored in every checkpoint); every ``rollout`` steps the policy is updated for
``epochs`` passes of shuffled minibatches. The sampled action is a data-dependent decision
(``action``: inverse-CDF over the policy's probabilities with the step's own uniform draw).

    python -m trainmaster.jobs.recipes.ppo --steps 40000
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..decisions import entry_bytes, interval_margin
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
from .hyperparameters import PPOConfig
from .cartpole import GROWTH_BYTES, OBS_DIM, CartPole
from .running_std import RunningMeanStd


def _mlp(inputs: int, hidden: int, outputs: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, outputs))


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int):
        super().__init__()
        self.actor = _mlp(obs_dim, hidden, n_actions)
        self.critic = _mlp(obs_dim, hidden, 1)


class Rollout:
    """Storage for one rollout; partly filled between updates, so it is part of the state."""

    FIELDS = ("obs", "action", "logprob", "reward", "done", "value")

    def __init__(self, length: int, obs_dim: int):
        self.obs = torch.zeros(length, obs_dim)
        self.action = torch.zeros(length, dtype=torch.int64)
        self.logprob = torch.zeros(length)
        self.reward = torch.zeros(length)
        self.done = torch.zeros(length)
        self.value = torch.zeros(length)
        self.size = 0

    def state(self) -> dict[str, torch.Tensor]:
        return {**{name: getattr(self, name)[: self.size] for name in self.FIELDS}, "size": scalar(self.size)}

    def load_state(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.size = int(tensors["size"])
        for name in self.FIELDS:
            getattr(self, name)[: self.size] = tensors[name]


class PPOTrainer:
    def __init__(self, config: PPOConfig, seed: int):
        self.config = config
        self.env = CartPole(seed)
        obs_dim = self.env.obs.shape[0]
        self.device = resolve_device(config.device)
        torch.manual_seed(derive_seed(seed, 0, "init"))
        self.model = ActorCritic(obs_dim, self.env.n_actions, config.hidden).to(self.device)  # W0 drawn on the CPU
        self.params = list(self.model.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=config.lr, eps=1e-5, foreach=True)
        self.rollout = Rollout(config.rollout, obs_dim)
        self.returns = RunningMeanStd()
        self.discounted = 0.0  # the running discounted return whose std scales rewards
        self.global_step = 0
        self.updates = 0
        self.last_loss = 0.0

    def step(self, ctx: StepContext) -> Mapping[str, float]:
        obs = torch.from_numpy(self.env.obs)
        with torch.no_grad():  # the rollout is kept on the CPU; the networks run where the config says
            on_device = obs.to(self.device)
            logits, value = self.model.actor(on_device).cpu(), self.model.critic(on_device).cpu()
        action = self._sample(ctx, logits)
        transition, metrics = self.env.step(action, ctx.seed, ctx.step)
        r = self.rollout
        i = r.size
        r.obs[i], r.action[i], r.value[i] = obs, action, value[0]
        r.logprob[i] = F.log_softmax(logits, dim=-1)[action]
        r.reward[i] = self._scaled_reward(transition.reward, transition.finished)
        r.done[i] = float(transition.finished)
        r.size += 1
        self.global_step += 1
        if r.size == self.config.rollout:
            self.last_loss = self._update(ctx)
            r.size = 0
        if metrics:
            metrics = {**metrics, "global_step": self.global_step, "updates": self.updates, "loss": self.last_loss}
        return metrics

    def _sample(self, ctx: StepContext, logits: torch.Tensor) -> int:
        cdf = torch.cumsum(F.softmax(logits.double(), dim=-1), dim=-1)
        point = torch.tensor(ctx.rng("action").random(), dtype=torch.float64) * cdf[-1]
        own = torch.searchsorted(cdf, point, right=True).clamp(max=len(cdf) - 1)
        return int(ctx.decisions.decide("action", own, len(cdf), interval_margin(cdf, point)))

    def _scaled_reward(self, reward: float, finished: bool) -> float:
        """Divide by the running std of the discounted return (the return resets at episode ends)."""
        self.discounted = self.discounted * self.config.gamma + reward
        self.returns.update(self.discounted)
        if finished:
            self.discounted = 0.0
        clip = self.config.reward_clip
        return max(-clip, min(clip, reward / self.returns.std()))

    def _advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        c, r = self.config, self.rollout
        with torch.no_grad():
            next_value = self.model.critic(torch.from_numpy(self.env.obs).to(self.device))[0].cpu()
        advantages = torch.zeros(c.rollout)
        gae = torch.tensor(0.0)
        for t in reversed(range(c.rollout)):
            following = next_value if t == c.rollout - 1 else r.value[t + 1]
            live = 1.0 - r.done[t]
            delta = r.reward[t] + c.gamma * following * live - r.value[t]
            gae = delta + c.gamma * c.gae_lambda * live * gae
            advantages[t] = gae
        return advantages, advantages + r.value

    def _update(self, ctx: StepContext) -> float:
        c, r = self.config, self.rollout
        advantages, returns = self._advantages()
        for group in self.optimizer.param_groups:  # the spec's value, whatever a state file says
            group["lr"] = c.lr
        generator = ctx.generator("minibatch")
        loss = torch.tensor(0.0)
        for _ in range(c.epochs):
            order = torch.randperm(c.rollout, generator=generator)
            for start in range(0, c.rollout, c.minibatch):
                idx = order[start : start + c.minibatch]
                batch = (r.obs[idx], r.action[idx], r.logprob[idx], advantages[idx], returns[idx])
                loss = self._loss(*(t.to(self.device) for t in batch))
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.params, c.max_grad_norm, foreach=True)
                self.optimizer.step()
        self.updates += 1
        return float(loss.detach())

    def _loss(self, obs, action, old_logprob, advantage, returns) -> torch.Tensor:
        c = self.config
        log_probs = F.log_softmax(self.model.actor(obs), dim=-1)
        logprob = log_probs.gather(1, action.unsqueeze(1)).squeeze(1)
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        ratio = torch.exp(logprob - old_logprob)
        policy = -torch.min(ratio * advantage, ratio.clamp(1 - c.clip, 1 + c.clip) * advantage).mean()
        predicted = self.model.critic(obs).squeeze(1)
        # in the critic's dtype: a float64 critic (the float64 honest variant) against the rollout's float32 returns
        # fails in CUDA's mse_loss backward ("Found dtype Float but expected Double"); a no-op in the spec's fp32
        value = F.mse_loss(predicted, returns.to(predicted.dtype))
        entropy = -(log_probs.exp() * log_probs).sum(dim=1).mean()
        return policy + c.value_coef * value - c.entropy_coef * entropy

    def state(self) -> TrainState:
        return TrainState(
            weights=module_state(self.model),
            rest={
                **prefixed("optimizer", optimizer_state(self.optimizer)),
                **prefixed("rollout", self.rollout.state()),
                **prefixed("reward_scale", self.returns.state()),
                **prefixed("env", self.env.state()),
                "discounted_return": scalar(self.discounted),
                "global_step": scalar(self.global_step),
                "updates": scalar(self.updates),
                "last_loss": scalar(self.last_loss),
            },
        )

    def load_state(self, state: TrainState) -> None:
        load_module_state(self.model, state.weights)
        load_optimizer_state(self.optimizer, section("optimizer", state.rest))
        self.rollout.load_state(section("rollout", state.rest))
        self.returns.load_state(section("reward_scale", state.rest))
        self.env.load_state(section("env", state.rest))
        self.discounted = float(state.rest["discounted_return"])
        self.global_step = int(state.rest["global_step"])
        self.updates = int(state.rest["updates"])
        self.last_loss = float(state.rest["last_loss"])

    def result(self) -> dict[str, float | int]:
        return {
            "mean_return_last_20": self.env.mean_recent_return(),
            "episodes": self.env.episodes,
            "global_step": self.global_step,
            "updates": self.updates,
            "final_loss": self.last_loss,
        }


RULES = StateRules(
    fields={
        **optimizer_rules("optimizer"),
        "rollout/logprob": "close",  # the policy's and the critic's outputs at each step
        "rollout/value": "close",
        "rollout/*": "exact",  # observations, actions, scaled rewards, dones: what the recorded actions produce
        "reward_scale/*": "exact",
        "env/*": "exact",
        "discounted_return": "exact",
        "global_step": "exact",
        "updates": "exact",
        "last_loss": "reported",
    },
    growth_bytes=lambda c: c.rollout * (OBS_DIM * 4 + 8 + 4 * 4) + GROWTH_BYTES,
    decision_bytes=lambda c: entry_bytes(1),  # the sampled action
)

RECIPE = Recipe(name="ppo", config_type=PPOConfig, build=PPOTrainer, rules=RULES)

if __name__ == "__main__":
    sys.exit(cli.main(RECIPE, "ppo"))

"""A 2-layer transformer language model on a seeded synthetic token stream (recipe name ``tiny-lm``).

The data is a random Markov chain over ``vocab`` tokens whose rows are drawn from a Dirichlet
with small ``concentration`` (so the next token is fairly predictable); the chain is a pure
function of the job seed and the batch of step ``s`` a pure function of ``(seed, s)``. The best
achievable loss is the chain's entropy rate, reported in ``result.json`` next to the final loss.
AdamW with linear warm-up then cosine decay, set from the step every step. Dropout (attention
weights, MLP output) by :class:`~trainmaster.jobs.hash_dropout.HashDropout`, whose masks are the
same on every device, so a run trained on a GPU replays on a CPU verifier. ``--device``: where it
trains (``auto``: CUDA when the job has a GPU). No decisions.

    python -m trainmaster.jobs.recipes.tiny_lm --steps 400
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..devices import resolve_device
from ..hash_dropout import DropoutKeys, HashDropout
from ..recipe import Recipe, StateRules, StepContext
from ..seeding import derive_seed, step_rng
from ..state import (
    TrainState,
    load_module_state,
    load_optimizer_state,
    module_state,
    optimizer_rules,
    optimizer_state,
    prefixed,
    section,
)
from . import cli
from .hyperparameters import TinyLMConfig

RECENT = 20  # steps averaged for the reported final loss


class MarkovChain:
    """The synthetic source: transition matrix and its entropy rate."""

    def __init__(self, vocab: int, concentration: float, seed: int):
        rng = step_rng(seed, 0, "markov-chain")
        self.transitions = rng.dirichlet(np.full(vocab, concentration), size=vocab)
        self.cdf = torch.from_numpy(np.cumsum(self.transitions, axis=1))

    def sample(self, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """``batch`` sequences of ``length`` tokens; the first token uniform, then the chain."""
        vocab = self.cdf.shape[0]
        u = torch.rand(batch, length, generator=generator, dtype=torch.float64)
        tokens = torch.empty(batch, length, dtype=torch.int64)
        tokens[:, 0] = (u[:, 0] * vocab).long()
        for t in range(1, length):
            rows = self.cdf[tokens[:, t - 1]]
            tokens[:, t] = torch.searchsorted(rows, u[:, t : t + 1] * rows[:, -1:], right=True).squeeze(1).clamp(max=vocab - 1)
        return tokens

    def entropy_rate(self) -> float:
        """``sum_i pi_i H(P_i)`` in nats, pi the stationary distribution."""
        values, vectors = np.linalg.eig(self.transitions.T)
        pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
        pi = pi / pi.sum()
        p = self.transitions
        row_entropy = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        return float(pi @ row_entropy)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float, keys: DropoutKeys):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.attention_dropout = HashDropout(dropout, keys)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), HashDropout(dropout, keys))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = self.attention_dropout(F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1))
        x = x + self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, c: TinyLMConfig, keys: DropoutKeys):
        super().__init__()
        self.embed = nn.Embedding(c.vocab, c.d_model)
        self.position = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.Sequential(*(Block(c.d_model, c.heads, c.dropout, keys) for _ in range(c.layers)))
        self.norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.head(self.norm(self.blocks(self.embed(tokens) + self.position(positions))))


class TinyLMTrainer:
    def __init__(self, config: TinyLMConfig, seed: int):
        if config.d_model % config.heads:
            raise ValueError("d_model must be a multiple of heads")
        self.config = config
        self.chain = MarkovChain(config.vocab, config.concentration, seed)
        self.device = resolve_device(config.device)
        torch.manual_seed(derive_seed(seed, 0, "init"))
        self.keys = DropoutKeys()
        self.model = TinyLM(config, self.keys).to(self.device)  # initialised on the CPU: W0 is the same on every device
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.recent: list[float] = []

    def lr_at(self, step: int) -> float:
        c = self.config
        if step < c.warmup:
            return c.lr * (step + 1) / c.warmup
        progress = (step - c.warmup) / max(1, c.steps - c.warmup)
        return c.lr * 0.5 * (1.0 + math.cos(math.pi * progress))

    def step(self, ctx: StepContext) -> Mapping[str, float]:
        c = self.config
        self.keys.start(ctx.seed, ctx.step)
        tokens = self.chain.sample(c.batch_size, c.seq_len + 1, ctx.generator("data")).to(self.device)
        logits = self.model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, c.vocab), tokens[:, 1:].reshape(-1))
        lr = self.lr_at(ctx.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        value = float(loss.detach())
        self.recent = (self.recent + [value])[-RECENT:]
        return {"loss": value, "lr": lr}

    def state(self) -> TrainState:
        return TrainState(
            weights=module_state(self.model),
            rest={
                **prefixed("optimizer", optimizer_state(self.optimizer)),
                "recent_losses": torch.tensor(self.recent, dtype=torch.float64),
            },
        )

    def load_state(self, state: TrainState) -> None:
        load_module_state(self.model, state.weights)
        load_optimizer_state(self.optimizer, section("optimizer", state.rest), scheduled=("lr",))
        self.recent = state.rest["recent_losses"].tolist()

    def result(self) -> dict[str, float]:
        return {
            "final_loss": statistics.fmean(self.recent),
            "entropy_rate": self.chain.entropy_rate(),
            "uniform_loss": math.log(self.config.vocab),
        }


RULES = StateRules(
    fields={**optimizer_rules("optimizer"), "recent_losses": "reported"},
    growth_bytes=lambda c: RECENT * 8,
)

RECIPE = Recipe(name="tiny-lm", config_type=TinyLMConfig, build=TinyLMTrainer, rules=RULES)

if __name__ == "__main__":
    sys.exit(cli.main(RECIPE, "tiny_lm"))

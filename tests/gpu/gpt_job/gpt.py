"""A GPT-style language model on the runtime: the job's own recipe of the GPU check (and of CPU tests, small).

Pre-LN transformer blocks (LayerNorm, causal self-attention, an MLP with bias and GELU), learned
position embeddings, an untied head; AdamW with linear warm-up then a constant rate; dropout on both
residual branches by ``HashDropout`` (the same masks on every device, so a run trained on a GPU is
re-executed on a CPU verifier). Attention is written out (matmul, causal mask, softmax): deterministic
kernels on a GPU, and the same arithmetic on a CPU. Data: the tiny-lm recipe's seeded Markov
chain over ``vocab`` tokens, the batch of step s a pure function of ``(seed, s)``, drawn on the CPU.

At d 768, 12 layers, 12 heads, vocab 512, seq 256 it has 86M parameters (the GPU check's size);
the CPU tests run it at d 32 with 2 layers.

    python gpt.py --steps 100 --d-model 768 --layers 12 --heads 12 --seq-len 256 --batch-size 32
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from trainmaster.jobs.devices import DeviceOption, resolve_device
from trainmaster.jobs.hash_dropout import DropoutKeys, HashDropout
from trainmaster.jobs.recipe import Recipe, RecipeConfig, StateRules, StepContext
from trainmaster.jobs.recipes.cli import main
from trainmaster.jobs.recipes.tiny_lm import MarkovChain
from trainmaster.jobs.seeding import derive_seed
from trainmaster.jobs.state import (
    TrainState,
    load_module_state,
    load_optimizer_state,
    module_state,
    optimizer_rules,
    optimizer_state,
    prefixed,
    section,
)

RECENT = 20


class GPTConfig(RecipeConfig):
    steps: int = Field(100, gt=0)
    vocab: int = Field(512, gt=1)
    concentration: float = Field(0.1, gt=0)
    d_model: int = Field(768, gt=0)
    heads: int = Field(12, gt=0)
    layers: int = Field(12, gt=0)
    seq_len: int = Field(256, gt=1)
    batch_size: int = Field(32, gt=0)
    lr: float = Field(3e-4, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    warmup: int = Field(20, ge=0)
    dropout: float = Field(0.1, ge=0, lt=1)
    device: DeviceOption = "auto"


class Attention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = F.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float, keys: DropoutKeys):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop1, self.drop2 = HashDropout(dropout, keys), HashDropout(dropout, keys)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop2(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    def __init__(self, c: GPTConfig, keys: DropoutKeys):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c.d_model, c.heads, c.dropout, keys) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class GPTTrainer:
    def __init__(self, config: GPTConfig, seed: int):
        if config.d_model % config.heads:
            raise ValueError("d_model must be a multiple of heads")
        self.config, self.device = config, resolve_device(config.device)
        self.chain = MarkovChain(config.vocab, config.concentration, seed)
        self.keys = DropoutKeys()
        torch.manual_seed(derive_seed(seed, 0, "init"))
        self.model = GPT(config, self.keys).to(self.device)  # initialised on the CPU: the same W0 on every device
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        self.recent: list[float] = []

    def lr_at(self, step: int) -> float:
        c = self.config
        return c.lr * min(1.0, (step + 1) / c.warmup) if c.warmup else c.lr

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
            rest={**prefixed("optimizer", optimizer_state(self.optimizer)),
                  "recent_losses": torch.tensor(self.recent, dtype=torch.float64)},
        )

    def load_state(self, state: TrainState) -> None:
        load_module_state(self.model, state.weights)
        load_optimizer_state(self.optimizer, section("optimizer", state.rest), scheduled=("lr",))
        self.recent = state.rest["recent_losses"].tolist()

    def result(self) -> dict[str, float]:
        return {"final_loss": sum(self.recent) / max(1, len(self.recent)), "parameters": float(
            sum(p.numel() for p in self.model.parameters()))}


RULES = StateRules(fields={**optimizer_rules("optimizer"), "recent_losses": "reported"},
                   growth_bytes=lambda c: RECENT * 8)
RECIPE = Recipe(name="gpt", config_type=GPTConfig, build=GPTTrainer, rules=RULES)

if __name__ == "__main__":
    sys.exit(main(RECIPE))

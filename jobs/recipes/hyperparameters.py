"""The shipped recipes' hyperparameters (``dqn``, ``ppo``, ``tiny-lm``), without torch: the broker and the
verification read a spec's config (its steps T, say) from these, and import a recipe's module (torch, gymnasium,
the model) only to train or replay it. Each recipe module builds its ``Recipe`` with its class here.
"""

from __future__ import annotations

from pydantic import Field

from ..recipe_config import DeviceOption, RecipeConfig
from .options import DEVICE_DEFAULT, DEVICE_HELP


class DQNConfig(RecipeConfig):
    steps: int = Field(10_000, gt=0, description="environment (and training) steps T")
    lr: float = Field(5e-4, gt=0, description="Adam learning rate")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    batch_size: int = Field(64, gt=0, description="minibatch size")
    buffer_size: int = Field(20_000, gt=0, description="replay capacity")
    learning_starts: int = Field(500, ge=0, description="steps of pure collection before learning")
    train_every: int = Field(1, gt=0, description="steps between gradient steps")
    hidden: int = Field(64, gt=0, description="width of the two hidden layers")
    tau: float = Field(0.01, gt=0, le=1, description="soft target update rate")
    eps_start: float = Field(1.0, ge=0, le=1, description="initial exploration rate")
    eps_end: float = Field(0.02, ge=0, le=1, description="final exploration rate")
    eps_fraction: float = Field(0.1, gt=0, le=1, description="fraction of the run over which epsilon decays")
    alpha: float = Field(0.6, ge=0, description="priority exponent")
    beta_start: float = Field(0.4, ge=0, le=1, description="initial importance-sampling exponent (annealed to 1)")
    priority_eps: float = Field(1e-6, gt=0, description="added to |TD error| for priorities")
    grad_clip: float = Field(10.0, gt=0, description="max gradient norm")
    device: DeviceOption = Field(DEVICE_DEFAULT, description=DEVICE_HELP)


class PPOConfig(RecipeConfig):
    steps: int = Field(40_000, gt=0, description="environment steps T (the global step counter's end)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    rollout: int = Field(256, gt=0, description="environment steps per update")
    epochs: int = Field(4, gt=0, description="passes over each rollout")
    minibatch: int = Field(64, gt=0, description="minibatch size")
    gamma: float = Field(0.99, gt=0, le=1, description="discount")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    clip: float = Field(0.2, gt=0, description="policy ratio clip range")
    value_coef: float = Field(0.5, ge=0, description="value loss weight")
    entropy_coef: float = Field(0.01, ge=0, description="entropy bonus weight")
    max_grad_norm: float = Field(0.5, gt=0, description="max gradient norm")
    hidden: int = Field(64, gt=0, description="width of the hidden layers")
    reward_clip: float = Field(10.0, gt=0, description="clip of the scaled reward")
    device: DeviceOption = Field(DEVICE_DEFAULT, description=DEVICE_HELP)


class TinyLMConfig(RecipeConfig):
    steps: int = Field(400, gt=0, description="optimizer steps T")
    vocab: int = Field(32, gt=1, description="vocabulary size")
    concentration: float = Field(0.1, gt=0, description="Dirichlet concentration of the chain's rows")
    d_model: int = Field(64, gt=0, le=128, description="model width")
    heads: int = Field(4, gt=0, description="attention heads")
    layers: int = Field(2, gt=0, description="transformer blocks")
    seq_len: int = Field(64, gt=1, description="tokens per sequence")
    batch_size: int = Field(16, gt=0, description="sequences per batch")
    lr: float = Field(3e-3, gt=0, description="peak AdamW learning rate")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    warmup: int = Field(40, ge=0, description="linear warm-up steps")
    dropout: float = Field(0.1, ge=0, lt=1, description="dropout (masks hashed from seed and step: the same on every device)")
    device: DeviceOption = Field(DEVICE_DEFAULT, description=DEVICE_HELP)


CONFIGS: dict[str, type[RecipeConfig]] = {"dqn": DQNConfig, "ppo": PPOConfig, "tiny-lm": TinyLMConfig}
"""Each shipped recipe's config type, by recipe name (``jobs/recipes/__init__.py`` MODULES names their modules)."""

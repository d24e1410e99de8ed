"""What a recipe's hyperparameters are, without torch: the base of every recipe config and its ``device`` field.

The broker and the verification read a shipped recipe's config (its total steps T, say) from a job spec; this
module, and the shipped configs in ``jobs/recipes/hyperparameters.py``, let them do so without importing torch
(~2 s of CPU per process). ``jobs/recipe.py`` (the contract a trainer implements) re-exports ``RecipeConfig``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DeviceOption = Literal["auto", "cpu", "cuda"]
"""A recipe config's ``device`` field (``jobs/devices.py`` resolves it)."""


class RecipeConfig(BaseModel):
    """Hyperparameters of a recipe. Stored in every state, so a replay rebuilds the same trainer."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    steps: int = Field(gt=0, description="total training steps T (a multiple of k)")
    threads: int = Field(1, ge=1, description="torch intra-op threads; a bit-exact replay needs the same")

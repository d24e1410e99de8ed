"""Whether an executor's S_i could have come out of honest training at all (checked before re-executing it).

S_i is compared with a re-execution only when segment i − 1 is challenged too; otherwise the audit
re-executes honestly from whatever S_i says. Optimizer moments are where a crafted S_i hides: second
moments inflated 1e12× freeze training, and first moments large against the second ones walk the
weights anywhere the executor likes in k steps (delivering chosen weights). Adam's moments obey a
bound whatever the gradients were (``m`` and ``v`` start at zero)::

    m = (1 − β₁) Σ_j β₁^(t−j) g_j,   v = (1 − β₂) Σ_j β₂^(t−j) g_j²
    m² ≤ (1 − β₁)² / (1 − β₂) · 1 / (1 − β₁²/β₂) · v          (Cauchy–Schwarz, β₁² < β₂)

so ``|m| ≤ C(β) √v`` elementwise (C ≈ 7.27 for Adam's default betas); honest moments never exceed
it, by any margin, while a walk to chosen weights needs ``|m| / √v`` far above it. The betas are the
spec's (the optimizer's param groups as the verifier's own trainer holds them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from trainmaster.jobs.state import section, tensor_json

Tensors = Mapping[str, torch.Tensor]
PARAM_GROUPS = "param_groups.json"
SLACK = 1.01
"""Room for float32 rounding in the moments (the bound is exact in real arithmetic)."""
UNDERFLOW = 1e-20
"""Room for gradients below ~4e-23, whose squares underflow to 0 in v while they still count in m."""


def moment_bound(beta1: float, beta2: float) -> float:
    """C(β): the largest ``|m| / √v`` any gradient sequence gives Adam's moments (inf when β₁² ≥ β₂)."""
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1) or beta1 * beta1 >= beta2:
        return math.inf
    return (1 - beta1) / math.sqrt(1 - beta2) / math.sqrt(1 - beta1 * beta1 / beta2)


def implausible_moments(state_rest: Tensors, spec_rest: Tensors) -> list[str]:
    """Adam first moments in ``state_rest`` (S_i) larger than ``C(β) √v`` allows, betas from ``spec_rest``.

    Returns one line per offending entry (its worst ratio ``|m| / √v`` and the bound).
    """
    problems = []
    for prefix in sorted({name[: -len(PARAM_GROUPS) - 1] for name in spec_rest if name.endswith("/" + PARAM_GROUPS)}):
        betas = _betas_by_param(tensor_json(spec_rest[f"{prefix}/{PARAM_GROUPS}"]))
        moments = section(f"{prefix}/state", state_rest)
        for name, m in sorted(moments.items()):
            param, _, key = name.partition("/")
            v = moments.get(f"{param}/exp_avg_sq")
            if key != "exp_avg" or v is None or not param.isdigit() or int(param) not in betas:
                continue
            bound = moment_bound(*betas[int(param)])
            if not math.isfinite(bound) or v.shape != m.shape:
                continue
            excess = m.double().abs() - (SLACK * bound * v.double().clamp(min=0).sqrt() + UNDERFLOW)
            if bool((excess > 0).any()):
                ratio = float((m.double().abs() / v.double().clamp(min=0).sqrt()).nan_to_num(math.inf).max())
                problems.append(
                    f"{prefix}/state/{name}: |m| / √v reaches {ratio:.3g}, more than the {bound:.3g} any gradients give"
                )
    return problems


def _betas_by_param(groups: object) -> dict[int, tuple[float, float]]:
    """Parameter index → (β₁, β₂) from an optimizer's param groups (those without betas are skipped)."""
    found = {}
    for group in groups if isinstance(groups, list) else []:
        betas = group.get("betas") if isinstance(group, dict) else None
        if isinstance(betas, list) and len(betas) == 2:
            found.update({int(p): (float(betas[0]), float(betas[1])) for p in group.get("params", [])})
    return found

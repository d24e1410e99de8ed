"""The update-norm sanity check's measure: the segment's relative update per unit of learning rate.

A re-execution that barely moves the weights passes the r test trivially when the executor's
S_{i+1} barely moved either; that is the shape of a manipulated optimizer state (inflated second
moments, zeroed momentum) or an "infinitesimal update" chain (docs/protocol.md §4, §10). The
check compares ``‖W_re − W_i‖ / ‖W_i‖`` with the job class's calibration.

Learning-rate schedules (warm-up, cosine decay to zero) legitimately shrink updates by orders of
magnitude, so the relative update is divided by the learning rate the verifier's own re-execution
ended the segment with: the largest ``lr`` in any optimizer's ``param_groups.json`` in the replayed
rest (the convention of :func:`trainmaster.jobs.state.optimizer_state`). A recipe without one is
measured by its relative update alone.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainmaster.jobs.state import tensor_json

from .distance import Distance

PARAM_GROUPS = "param_groups.json"


def update_per_lr(distance: Distance, replayed_rest: Mapping[str, torch.Tensor]) -> float:
    """``‖W_re − W_i‖ / (‖W_i‖ · lr)``, lr as the verifier's re-execution last set it (1 if none is found)."""
    lr = last_lr(replayed_rest)
    return distance.relative_update / lr if lr else distance.relative_update


def last_lr(rest: Mapping[str, torch.Tensor]) -> float | None:
    """The largest positive ``lr`` among the optimizer param groups stored in ``rest``, if any."""
    rates = [
        float(group["lr"])
        for name, tensor in rest.items()
        if name == PARAM_GROUPS or name.endswith("/" + PARAM_GROUPS)
        for group in tensor_json(tensor)
        if isinstance(group, dict) and isinstance(group.get("lr"), int | float) and group["lr"] > 0
    ]
    return max(rates, default=None)

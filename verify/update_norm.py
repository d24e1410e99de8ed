"""The update-norm sanity check's measure: the segment's relative update per unit of learning rate.

A re-execution that barely moves the weights passes the r test trivially when the executor's
S_{i+1} barely moved either; that is the shape of a manipulated optimizer state (inflated second
moments, zeroed momentum) or an "infinitesimal update" chain (docs/protocol.md §4, §10). The
check compares ``‖W_re − W_i‖ / ‖W_i‖`` with the job class's calibration.

Learning-rate schedules (warm-up, cosine decay to zero) legitimately shrink updates by orders of
magnitude, so the relative update is divided by the largest learning rate any optimizer step of the
verifier's own re-execution used (:attr:`trainmaster.jobs.replay.ReplayResult.peak_lr`); failing
that (no torch optimizer stepped), the largest ``lr`` in the replayed rest's ``param_groups.json``
(the convention of :func:`trainmaster.jobs.state.optimizer_state`). A recipe with neither is
measured by its relative update alone.

The calibration gives a floor (a segment that barely moves: inflated second moments, zeroed
momentum) and a ceiling (a segment that moves far more than any honest one: moments crafted to walk
the weights somewhere chosen) on this measure.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainmaster.jobs.replay import ReplayResult
from trainmaster.jobs.state import tensor_json

from .distance import Distance

PARAM_GROUPS = "param_groups.json"


def update_per_lr(distance: Distance, replay: ReplayResult) -> float:
    """``‖W_re − W_i‖ / (‖W_i‖ · lr)``, lr the largest the re-execution stepped with (1 if none is found)."""
    lr = replay.peak_lr or last_lr(replay.state.rest)
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

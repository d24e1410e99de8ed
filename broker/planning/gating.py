"""Capability gating: the features a job needs against what a backend supports for this request.

One function for every backend, run by the broker before a backend is asked for offers: a backend
that lacks a needed feature is not asked, and the plan says why, in the backend's own words
("multi_node: runs on this machine only"). A backend declares what it cannot do once, as data
(`backends.features` mixins with `Backend.unsupported` reasons, plus `Backend.lacks(request)` for
limits that depend on the request).
"""

from __future__ import annotations

from trainmaster.backends.base import Backend, OfferRequest
from trainmaster.backends.features import needed, unsupported


def gate(backend: Backend, request: OfferRequest) -> list[str]:
    """Why `backend` cannot run `request` for lack of a feature, one reason per missing feature (empty: it can)."""
    need = needed(request.spec)
    if not need:
        return []
    missing = {**unsupported(type(backend)), **backend.lacks(request)}
    return [f"{feature}: {missing[feature]}" for feature in sorted(need) if feature in missing]

"""Which backends may be planned for a job: only those ready here, and none whose set-up refused this job before.

Readiness is each backend's own offline check (`backends.registry.BackendEntry.readiness`: its extra, its
credentials, the bucket, role or workspace it needs), the same answer `trainmaster backends check` gives. A
price catalog prices a cloud whether or not this account can run anything there, so without this gate a cloud
with no bucket would be chosen, fail at dispatch, and be chosen again on its next offer. The gate applies to the
backends whose offers come from a catalog (`BackendEntry.catalog`: aws, gcp, azure); the others' offers are
live answers (this machine's GPUs, miners' signed quotes, a Ray cluster's resources) that already say why there
are none. A cloud that is not ready is never asked for offers: the plan lists it under `unavailable` with the
reasons, which `trainmaster offers` and `submit --dry-run` show.

A backend whose set-up refused an attempt of the job at dispatch (`ConfigurationError`: a missing bucket, a role
it cannot pass, a quota of zero; the attempt's cause `misconfigured`) is blocked as a whole for the rest of the
job (`blocked_backends`): the job goes on with the other backends, never in a loop over the same one's offers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainmaster.backends.base import BackendConfig, OfferSet

MISCONFIGURED = "misconfigured"
"""The cause recorded on an attempt that ended on a ConfigurationError (broker/failures.py)."""


def unready(names: Iterable[str], configs: Mapping[str, BackendConfig]) -> dict[str, list[str]]:
    """Backend name -> why it cannot run jobs here, for those of `names` the registry prices from a catalog and that
    are not ready with their effective configuration (`configs`); a ready backend is left out."""
    from trainmaster.backends.registry import REGISTRY

    found = {}
    for name in names:
        entry, config = REGISTRY.get(name), configs.get(name)
        if entry is None or config is None or not entry.catalog:
            continue
        reasons, _ = entry.readiness(config)
        if reasons:
            found[name] = ["not ready: " + "; ".join(reasons)]
    return found


def as_offer_sets(reasons: Mapping[str, list[str]]) -> list[OfferSet]:
    """The plan's account of the backends left out: no offers, and why."""
    return [OfferSet(backend=name, reasons=why) for name, why in reasons.items()]


def blocked_backends(attempts: Iterable, events: Iterable) -> frozenset[str]:
    """The backends an attempt of the job ended `misconfigured` on (its end event's cause)."""
    ended = {event.attempt_id for event in events
             if event.kind == "attempt" and isinstance(event.detail, dict) and event.detail.get("cause") == MISCONFIGURED}
    return frozenset(attempt.backend for attempt in attempts if attempt.id in ended)

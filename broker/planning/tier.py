"""The verification tier a job gets: its spec's `verification.tier`, else its workload class's in the policy
(`classes.<class>.verification.tier`, or `default`'s), else `sampled` (docs/protocol.md §3b, §3c)."""

from __future__ import annotations

from trainmaster.broker.planning.policy import Policy
from trainmaster.jobs.spec import JobSpec

TIERS = ("sampled", "replay", "refereed")


def verification_tier(spec: JobSpec, policy: Policy) -> str:
    """`sampled`, `replay` or `refereed`: the spec's choice wins over the policy's for its class."""
    return spec.verification.tier or policy.for_class(spec.workload).verification.tier or "sampled"

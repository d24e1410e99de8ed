"""Why a job that failed has no other offer to fall back to, in the words its user needs: the attempt's
own reason first (that is what to fix), then where it failed and why nothing else may run it."""

from __future__ import annotations

BLOCKED = "blocked after a failed attempt"
"""The planner's verdict on an offer an attempt of this job already failed on (broker/planning/planner.py)."""


def no_fallback_reason(failure: str, plan, policy_name: str) -> str:
    """`failure`: the failed attempt's reason; `plan`: the new plan, which chose nothing."""
    blocked = sorted({r.offer.backend for r in plan.rows if r.verdict == BLOCKED})
    others = [r for r in plan.rows if r.verdict != BLOCKED]
    if not blocked or others:  # offers that lost for reasons of their own: the planner's account says which
        return f"{failure}\nno other offer is left to try:\n" + plan.explain_failure().partition("\n")[2]
    where = ", ".join(blocked)
    if not plan.reasons:
        return (f"{failure}\nthe job failed on {where}, and no other backend is allowed by the policy {policy_name!r} "
                f"(chain: {' → '.join(plan.tiers)}), so nothing else was tried; fix the failure above and "
                "`trainmaster resume` the job")
    unavailable = "; ".join(f"{name}: {'; '.join(why)}" for name, why in plan.reasons.items())
    return (f"{failure}\nthe job failed on {where}, and no other backend can take it ({unavailable}); fix the "
            "failure above and `trainmaster resume` the job")

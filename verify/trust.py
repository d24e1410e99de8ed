"""What a verdict says about trust that no check decides: outcome-only trust, and a missing commitment that is the job's own.

* An untrusted executor's attempt verified without the replay audit (a job that makes no commitment
  and opts into outcome-only trust, broker/auditability.py) was judged by its outcome alone; its
  verdict's ``trust`` evidence states the risk (:data:`OUTCOME_ONLY_RISK`).
* A run whose job never makes a commitment (its entrypoint does not train through the runtime)
  cannot be replay-audited; that is the job's failure, never the executor's: the verdict is
  ``cannot_verify`` with :data:`JOB_FAULT` in its evidence, and the broker fails the attempt as its
  script would, banning no one.
"""

from __future__ import annotations

OUTCOME_ONLY_RISK = (
    "outcome-only trust: the executor's work was judged by the evaluation against the spec's thresholds alone; "
    "nothing it ran was re-executed, so a model made only to pass them (cut short, fitted to the evaluation, "
    "backdoored) would be accepted and paid"
)
JOB_FAULT = "job_fault"
"""Verdict evidence key: why the checks could not run through the job's own fault."""
NO_COMMITMENT = (
    "the job makes no commitment (its entrypoint does not train through the trainmaster runtime: no `recipe:`, not "
    "`python -m trainmaster.jobs.recipes.<name>`), so its replay audit cannot run: the job's failure, not the executor's"
)


def outcome_only_evidence() -> dict[str, object]:
    return {"mode": "outcome_only", "risk": OUTCOME_ONLY_RISK}

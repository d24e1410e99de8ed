"""Which jobs may be offered to untrusted compute, and whose fault a missing commitment is.

Untrusted executors (Bittensor miners) are paid only for work the broker verified, and the replay
audit verifies work by re-executing segments of a run that committed to its states. A job whose
entrypoint does not train through the runtime (no ``recipe:``, not ``python -m
trainmaster.jobs.recipes.<name>``: the shipped ``configs/examples/demo``, any plain script) commits to
nothing, so its audit cannot run. Sent to a miner it would come back without a ``commitment.json``
and the honest miner would be rejected and banned for the job's own shape. So planning knows first:

* :func:`untrusted_refusal` — such a job is not offered to untrusted backends (``Broker.plan`` asks
  only :func:`auditable_backends`); the plan (``submit --dry-run``, ``offers``) says why for each of
  them. A policy whose untrusted checks leave the replay audit out has chosen otherwise, for every job;
* unless its spec opts into **outcome-only trust** (:func:`outcome_only`): an evaluator with
  thresholds (``verification: {evaluator: …, thresholds: {…}}``) and not ``replay_audit: always``.
  Then the executor's work is judged by the held-out evaluation alone: what it ran is never
  re-executed, so a run that only *looks* trained (fitted to pass the thresholds, backdoored, cut
  short) is paid in full. The verdict says so (``verify/trust.py``, its ``trust`` evidence);
  docs/audit.md, "Outcome-only trust";
* :func:`job_fault` — a run that comes back without a commitment because its job never makes one
  is the job's failure (the attempt fails as its script would, nothing is paid), never the
  executor's: nobody is banned.
"""

from __future__ import annotations

from trainmaster.jobs.spec import JobSpec
from trainmaster.verify.trust import JOB_FAULT

UNTRUSTED_REASON = (
    "untrusted compute is paid only for audited work, and this job cannot be audited: its entrypoint does not "
    "train through the trainmaster runtime (no `recipe:`, not `python -m trainmaster.jobs.recipes.<name>`), so it "
    "commits to no states to replay. Use the runtime (docs/runtime.md), or opt into outcome-only trust with "
    "`verification: {evaluator: …, thresholds: {…}}` (docs/audit.md, Outcome-only trust)"
)
def makes_commitment(spec: JobSpec) -> bool:
    """Whether the job trains through the runtime, which commits to its states."""
    from trainmaster.verify.recipe_run import runs_runtime_recipe

    return runs_runtime_recipe(spec)


def outcome_only(spec: JobSpec) -> bool:
    """Whether the spec opts into outcome-only trust on untrusted compute (see the module docstring)."""
    settings = spec.verification
    return (not makes_commitment(spec) and bool(settings.evaluator) and bool(settings.thresholds)
            and settings.replay_audit != "always")


def untrusted_refusal(spec: JobSpec, backend_trusted: bool, *, audits_untrusted: bool = True) -> list[str]:
    """Why ``spec`` must not be offered by an untrusted backend (empty: it may). ``audits_untrusted``: the
    policy replay-audits untrusted work (a policy whose untrusted checks leave the audit out has chosen to
    judge such work without it, and says so in every verdict)."""
    if backend_trusted or not audits_untrusted or makes_commitment(spec) or outcome_only(spec):
        return []
    return [UNTRUSTED_REASON]


def auditable_backends(spec: JobSpec, policy, backends: dict) -> tuple[dict, list]:
    """The backends to ask for offers, and an answer with the reason for each untrusted one this job must not
    reach (asked of no one: a miner is not even sent a quote request)."""
    from trainmaster.backends.base import OfferSet
    from trainmaster.backends.registry import trusted

    audits = "replay" in policy.verification.untrusted
    kept, refused = {}, []
    for name, backend in backends.items():
        if reasons := untrusted_refusal(spec, trusted(name), audits_untrusted=audits):
            refused.append(OfferSet(backend=name, reasons=reasons))
        else:
            kept[name] = backend
    return kept, refused


def untrusted_checks(spec: JobSpec, checks: list[str]) -> list[str]:
    """An untrusted attempt's checks: without the replay audit when the job trusts outcomes only."""
    return [c for c in checks if c != "replay"] if outcome_only(spec) else checks


def job_fault(evidence: dict) -> str | None:
    """The reason a verdict's checks could not run through the job's own fault, if that is why."""
    found = evidence.get(JOB_FAULT)
    return found if isinstance(found, str) else None

"""The broker's own clock on an attempt run by an executor we do not control.

A miner's supervisor stops its run at the quoted hours, but a miner that stops answering, or keeps answering
"running", is not to be believed or waited for: the broker holds every untrusted attempt that has not returned
to the spec's `limits.max_hours` and the quote's hours, counted from its dispatch (our time, not the executor's
claimed `started_at`), plus a grace for starting and uploading. Past it, the attempt ends:

- the executor still answers, and says it runs: it ran past the time it was paid for — its doing
  (ExecutorFault: rejected, banned, the next offer);
- it does not answer: lost (failed, not banned: silence proves no fault; retried or the next offer), however
  long `unreachable_after_s` would still have waited.
"""

from __future__ import annotations

import time

from trainmaster.backends.base import BackendError, Cause, ExecutorFault, Offer
from trainmaster.backends.features import OVERRUN_GRACE_S
from trainmaster.backends.retry import retried
from trainmaster.broker.store import Attempt
from trainmaster.jobs.spec import JobSpec

GRACE_FRACTION = 0.1
"""Past the limit, an attempt gets this fraction of its limit plus its backend's overrun_grace_s (Bittensor's
`overrun_grace_s` setting, 60 s by default) before the broker ends it."""


def limit_s(spec: JobSpec, offer: Offer) -> tuple[float, str] | None:
    """The wall-clock seconds an untrusted attempt may take from its dispatch and what sets them; None for none."""
    limits = []
    if spec.limits.max_hours:
        limits.append((spec.limits.max_hours * 3600, f"the job's limits.max_hours ({spec.limits.max_hours:g} h)"))
    quoted = offer.detail.get("hours")
    if isinstance(quoted, (int, float)) and quoted > 0:
        limits.append((float(quoted) * 3600, f"the {quoted:g} h it quoted"))
    return min(limits, key=lambda found: found[0]) if limits else None  # the spec's own limit on a tie


def overdue(spec: JobSpec, attempt: Attempt, now: float | None = None, grace_s: float = OVERRUN_GRACE_S) -> str | None:
    """Why an untrusted attempt that has not returned is past its time (its limit, a tenth of it and `grace_s`),
    or None."""
    offer = Offer.model_validate_json(attempt.offer_json)
    if offer.trusted or attempt.state not in ("dispatched", "running"):
        return None
    found = limit_s(spec, offer)
    if found is None:
        return None
    seconds, what = found
    elapsed = (time.time() if now is None else now) - attempt.created_at
    if elapsed <= seconds * (1 + GRACE_FRACTION) + grace_s:
        return None
    return f"still not returned {elapsed:,.0f} s after its dispatch, past {what}"


async def judged(backend, handle, why: str) -> tuple[Cause | ExecutorFault, str] | None:
    """The failure of an overdue attempt, after one last question to its executor (and a cancel, best effort);
    None when it answers that its run has ended (the normal watch then takes it from there)."""
    try:
        st = await backend.status(handle)
    except BackendError:
        return Cause.lost, f"lost: {why}, and its executor does not answer"
    if st.phase.done:
        return None
    try:
        await retried(backend.cancel, handle, attempts=1)
    except BackendError:
        pass
    return ExecutorFault(why), f"{why}: its executor says it is still running, past the time it was paid for"

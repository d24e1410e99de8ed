"""The job and attempt state machines (docs/architecture.md §2).

A job walks submitted → planned → dispatched → running → returned → verifying → accepted; on a
backend that allocates its machine (local), a planned job that does not fit now waits `queued`
and is dispatched, in order, when capacity frees. An
attempt (one try on one offer) ends accepted, rejected, failed or cancelled; after a rejected or
failed attempt the job goes back to `planned` for the next offer, or ends `failed` when none is
left. An attempt whose checks could not run (a missing package, a full disk: `cannot_verify`) is
`unverified`: nothing is paid or blocked, and it waits for `trainmaster verify JOB --again`. A
`failed` or `cancelled` job goes back to `planned` only when the user resumes it. Every move is
checked here, so a bug or a race cannot skip a step.

Cancelling is requested, not forced: `trainmaster cancel` records the request on the job and ends
each unfinished attempt through its own end (`cancelled`, its reservation settled), and only then
the job; a process that dies half-way leaves the request, and the next `advance` finishes it. An
executor's fault can reject an attempt at any step (an altered transfer, a garbled answer). The
store refuses to end a job while an attempt of it is unfinished, and to end an attempt whose
reservation is still held (`Store.violations`).
"""

from __future__ import annotations

JOB_TRANSITIONS: dict[str, set[str]] = {
    "submitted": {"planned", "failed", "cancelled"},
    "planned": {"dispatched", "queued", "failed", "cancelled"},
    "queued": {"dispatched", "failed", "cancelled"},
    "dispatched": {"running", "returned", "planned", "failed", "cancelled"},
    "running": {"returned", "planned", "failed", "cancelled"},
    "returned": {"verifying", "planned", "failed", "cancelled"},
    "verifying": {"accepted", "planned", "failed", "unverified", "cancelled"},
    "unverified": {"verifying", "cancelled"},
    "accepted": set(),
    "failed": {"planned"},  # `trainmaster resume`
    "cancelled": {"planned"},  # `trainmaster resume`
}

ATTEMPT_TRANSITIONS: dict[str, set[str]] = {
    "dispatched": {"running", "returned", "failed", "rejected", "cancelled"},
    "running": {"returned", "failed", "rejected", "cancelled"},
    "returned": {"verifying", "failed", "rejected", "cancelled"},
    "verifying": {"accepted", "rejected", "failed", "unverified", "cancelled"},
    "unverified": {"verifying", "cancelled"},
    "accepted": set(),
    "rejected": set(),
    "failed": set(),
    "cancelled": set(),
}

JOB_ENDS = frozenset({"accepted", "failed", "cancelled"})
"""Nothing moves these on its own (a failed or cancelled job moves again only when resumed)."""
ATTEMPT_ENDS = frozenset(s for s, nxt in ATTEMPT_TRANSITIONS.items() if not nxt)
ACTIVE_ATTEMPT = frozenset({"dispatched", "running"})
WAITING = frozenset({"unverified"})
"""Attempts and jobs that wait for the user (`verify --again`), not for a backend."""


class IllegalTransition(RuntimeError):
    pass


def check(kind: str, current: str, target: str) -> None:
    table = JOB_TRANSITIONS if kind == "job" else ATTEMPT_TRANSITIONS
    if target not in table.get(current, set()):
        allowed = ", ".join(sorted(table.get(current, set()))) or "nothing (it has ended)"
        raise IllegalTransition(f"{kind} cannot go from {current} to {target}; from {current} it may go to {allowed}")

"""The job and attempt state machines (docs/architecture.md §2).

A job walks submitted → planned → dispatched → running → returned → verifying → accepted. An
attempt (one try on one offer) ends accepted, rejected, failed or cancelled; after a rejected or
failed attempt the job goes back to `planned` for the next offer, or ends `failed` when none is
left. Every move is checked here, so a bug or a race cannot skip a step.
"""

from __future__ import annotations

JOB_TRANSITIONS: dict[str, set[str]] = {
    "submitted": {"planned", "failed", "cancelled"},
    "planned": {"dispatched", "failed", "cancelled"},
    "dispatched": {"running", "returned", "planned", "failed", "cancelled"},
    "running": {"returned", "planned", "failed", "cancelled"},
    "returned": {"verifying", "planned", "failed", "cancelled"},
    "verifying": {"accepted", "planned", "failed"},
    "accepted": set(),
    "failed": set(),
    "cancelled": set(),
}

ATTEMPT_TRANSITIONS: dict[str, set[str]] = {
    "dispatched": {"running", "returned", "failed", "cancelled"},
    "running": {"returned", "failed", "cancelled"},
    "returned": {"verifying", "failed", "cancelled"},
    "verifying": {"accepted", "rejected", "failed"},
    "accepted": set(),
    "rejected": set(),
    "failed": set(),
    "cancelled": set(),
}

JOB_ENDS = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)
ATTEMPT_ENDS = frozenset(s for s, nxt in ATTEMPT_TRANSITIONS.items() if not nxt)
ACTIVE_ATTEMPT = frozenset({"dispatched", "running"})


class IllegalTransition(RuntimeError):
    pass


def check(kind: str, current: str, target: str) -> None:
    table = JOB_TRANSITIONS if kind == "job" else ATTEMPT_TRANSITIONS
    if target not in table.get(current, set()):
        allowed = ", ".join(sorted(table.get(current, set()))) or "nothing (it has ended)"
        raise IllegalTransition(f"{kind} cannot go from {current} to {target}; from {current} it may go to {allowed}")

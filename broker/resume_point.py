"""What `trainmaster resume` tells the user before it starts a job again: the step it resumes from (the
newest complete segment an earlier attempt left) or that it restarts from scratch, and the raised limits.

The step comes from the backend that holds the checkpoints (`last_checkpoint`); nothing here reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmaster.backends.features import CheckpointRef
from trainmaster.jobs.money import display_usd, format_usd, parse_usd



@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed job starts: `attempt`'s checkpoints, at `step` (segment `segment`); all None: from scratch."""

    attempt: int | None = None
    segment: int | None = None
    step: int | None = None
    why_not: str = ""

    def sentence(self) -> str:
        if self.attempt is None:
            return f"it restarts from scratch: {self.why_not}"
        if self.step is None:
            return f"it resumes from the checkpoints of attempt {self.attempt}"
        return f"it resumes from step {self.step} (segment {self.segment}, left by attempt {self.attempt})"

    def to_json(self) -> dict | None:
        if self.attempt is None:
            return None
        return {"attempt": self.attempt, "segment": self.segment, "step": self.step}


NOT_A_RUNTIME_JOB = ("no earlier attempt left a checkpoint; a job resumes mid-way only when it trains with "
                     "trainmaster's runtime (`trainmaster.jobs.runtime.run`, docs/runtime.md), which writes them")
UNTRUSTED = "an untrusted executor always starts from the job's own first state"


def resume_point(found: tuple[int, CheckpointRef] | None, *, trusted: bool) -> ResumePoint:
    """The point a resumed job starts from, given what the broker will hand the next attempt: an earlier
    attempt's number and the checkpoint its backend reported (`last_checkpoint`), or None."""
    if not trusted:
        return ResumePoint(why_not=UNTRUSTED)
    if found is None:
        return ResumePoint(why_not=NOT_A_RUNTIME_JOB)
    attempt, ref = found
    return ResumePoint(attempt=attempt, segment=ref.segment, step=ref.step)


def raised_limits(current: dict, max_hours: float | None, max_usd: str | None) -> tuple[dict, dict[str, list[str]]]:
    """The spec's `limits` as a resume raises them: (the new `limits` fields, as the spec's JSON writes them;
    each changed one as [before, after] for people). ValueError for a value that is not above the current one.
    `current`: the spec's limits as Python values (max_usd in micro-USD)."""
    fields: dict = {}
    shown: dict[str, list[str]] = {}
    if max_hours is not None:
        before = current.get("max_hours")
        if max_hours <= 0 or (before is not None and max_hours <= before):
            raise ValueError(f"--max-hours {max_hours:g} does not raise the job's max_hours ({_hours(before)})")
        fields["max_hours"], shown["max_hours"] = max_hours, [_hours(before), _hours(max_hours)]
    if max_usd is not None:
        micro, before = parse_usd(max_usd), current.get("max_usd")
        if micro <= 0 or (before is not None and micro <= before):
            raise ValueError(f"--max-usd {max_usd} does not raise the job's max_usd "
                             f"({'none' if before is None else display_usd(before)})")
        fields["max_usd"] = format_usd(micro)
        shown["max_usd"] = ["none" if before is None else display_usd(before), display_usd(micro)]
    return fields, shown


def _hours(value: float | None) -> str:
    return "none" if value is None else f"{value:g} h"

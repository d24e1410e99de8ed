"""The verdict on one returned attempt: what was checked, what was decided, and why."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.jobs.files import write_bytes_atomic

Outcome = Literal["accepted", "rejected", "cannot_verify"]
EXIT_CODES: dict[str, int] = {"accepted": 0, "rejected": 1, "cannot_verify": 2}
FILENAME = "verdict.json"


class Verdict(BaseModel):
    """``checks`` lists the checks that ran (passed or not); ``reasons`` why it is not accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    outcome: Outcome
    reasons: list[str] = Field(default_factory=list)
    checks: list[str] = Field(default_factory=list)
    evidence: dict[str, Any] = Field(default_factory=dict)
    job_id: str | None = None
    attempt_id: str | None = None
    decided_at: float = Field(default_factory=time.time)

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"

    @property
    def exit_code(self) -> int:
        """The CLI's exit code: 0 accepted, 1 rejected, 2 cannot verify."""
        return EXIT_CODES[self.outcome]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    def write(self, path: Path) -> Path:
        """Write ``verdict.json`` atomically: the bytes ``to_json`` gives, or the old file after a crash."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, self.to_json().encode("utf-8"))
        return path


def read_verdict(path: Path) -> Verdict:
    return Verdict.model_validate_json(Path(path).read_text(encoding="utf-8"))

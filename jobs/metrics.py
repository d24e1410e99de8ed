"""``metrics.jsonl``: one JSON object per line, ``{"step": <steps completed>, ...metrics}``.

Lines are appended as steps produce metrics and flushed at every checkpoint. On resume from the
state after step ``s`` the file is cut back to the lines with ``step <= s`` (dropping a torn last
line), so a resumed run leaves the same file as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from .files import write_bytes_atomic

FILENAME = "metrics.jsonl"


class MetricsLog:
    def __init__(self, path: Path, *, resume_step: int | None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            self._truncate_after(resume_step)
        self._handle = open(self.path, "a", encoding="utf-8")

    def _truncate_after(self, step: int) -> None:
        kept = []
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line torn by the kill; nothing after it was flushed either
                if record.get("step", math.inf) > step:
                    break
                kept.append(line + "\n")
        write_bytes_atomic(self.path, "".join(kept).encode("utf-8"))

    def append(self, step: int, metrics: Mapping[str, float]) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._handle.write(json.dumps(record, sort_keys=True) + "\n")

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def _plain(value: float) -> float | int | str:
    """Metrics as JSON numbers; a non-finite float is written as a string so the line stays valid JSON."""
    if isinstance(value, bool | int):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else str(value)

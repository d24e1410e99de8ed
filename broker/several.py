"""How a job reference that matches several jobs is told: the ids found, with `…` only when there are more."""

from __future__ import annotations

SHOWN = 5
"""At most this many matching ids are listed; ask for one more to know whether there are others."""


def several_jobs(ref: str, ids: list[str]) -> str:
    """`ids`: the matching ids, fetched up to SHOWN + 1 (more than SHOWN: the list is cut and says so)."""
    listed = ", ".join(ids[:SHOWN]) + (", …" if len(ids) > SHOWN else "")
    return f"{ref!r} matches several jobs: {listed}; give more of the id"

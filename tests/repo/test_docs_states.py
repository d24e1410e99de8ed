"""docs/architecture.md's state tables say exactly what broker/states.py allows."""

from __future__ import annotations

import re

import pytest

from trainmaster.broker import states
from repo_paths import ROOT

DOC = ROOT / "docs" / "architecture.md"


def documented(heading: str) -> dict[str, set[str]]:
    """state -> next states, from the markdown table whose first header cell is `heading`."""
    text = DOC.read_text()
    table = text[text.index(f"| {heading} | Next |"):].split("\n\n", 1)[0].splitlines()[2:]
    found = {}
    for row in table:
        cells = [c.strip() for c in row.strip("|").split("|")]
        nexts = set(re.findall(r"`([a-z]+)`", cells[1]))
        for state in re.findall(r"`([a-z]+)`", cells[0]):
            found[state] = nexts
    return found


@pytest.mark.parametrize("heading, table", [("Job state", states.JOB_TRANSITIONS),
                                            ("Attempt state", states.ATTEMPT_TRANSITIONS)])
def test_the_state_tables_match_the_code(heading, table):
    assert documented(heading) == table

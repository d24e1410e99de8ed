"""A cheating miner as a process of its own (tests/miner_support.py `MinerProcess`, started as
`python -m cheating_miners KIND ...`). The test's environment must have tests/ on PYTHONPATH (TESTS): the
miner and the jobs it runs import this package."""

from __future__ import annotations

import sys
from pathlib import Path

from miner_support import MinerProcess

TESTS = Path(__file__).resolve().parent.parent


class CheaterProcess(MinerProcess):
    """A cheater runs its own altered training unconfined (`confine: false`): its jobs are its own code, which
    imports this package from the test's PYTHONPATH, and confinement protects a miner from jobs, not brokers
    from miners."""

    def __init__(self, kind: str, home: Path, wallet, *, config: dict | None = None, **kwargs):
        super().__init__(home, wallet, config={**(config or {}), "confine": False}, **kwargs)
        self.kind = kind

    def command(self) -> list[str]:
        serve = super().command()
        return [sys.executable, "-m", "cheating_miners", self.kind, *serve[serve.index("serve") + 1:]]

"""Where the broker finds miners: the subnet's metagraph (metagraph.py) or a fixed list in backends.yaml.

A `Miner` is what the broker dispatches to: its hotkey (the receiver of our signed requests, and the
only key its quotes, commitments and countersignatures are checked against, never a key named in an
answer), its owner's coldkey (bans across hotkeys, payment) and the URL of its miner service.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainmaster.backends.bittensor.config import BittensorConfig


@dataclass(frozen=True)
class Miner:
    hotkey: str
    url: str
    coldkey: str | None = None
    stake_rao: int | None = None
    """Its stake, when the directory knows it (the metagraph does; a static list does not)."""


class MinerDirectory(Protocol):
    async def miners(self) -> list[Miner]:
        """The miners that serve now (an axon or URL each), at most the config's `max_miners`."""
        ...


class StaticDirectory:
    """The miners listed in backends.yaml, as they are listed."""

    def __init__(self, config: BittensorConfig):
        self.config = config

    async def miners(self) -> list[Miner]:
        return [Miner(hotkey=m.hotkey, url=m.url.rstrip("/"), coldkey=m.coldkey)
                for m in self.config.miners[: self.config.max_miners]]

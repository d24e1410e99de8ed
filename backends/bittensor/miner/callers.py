"""Whom the miner serves, checked after a request's signature: its `allow` list (when set) and its minimum-stake
rule (when `min_caller_stake_tao` is set): the caller's hotkey must hold at least that stake on subnet `netuid` of
`network`, as that subnet's metagraph reports it (read by backends/bittensor/metagraph.py's `read_neurons`).

Stakes are read at most once per `stake_refresh_s` and kept in between; one read at a time, so callers arriving
together share it. When the chain cannot be read and no fresh stakes are held, the caller is refused (503): a
caller is never served unchecked."""

from __future__ import annotations

import asyncio
import logging
import time

from trainmaster.backends.base import BackendError
from trainmaster.backends.bittensor.metagraph import read_neurons
from trainmaster.backends.bittensor.miner.config import MinerConfig

log = logging.getLogger(__name__)


class Refused(Exception):
    """The caller is not served: `status` (403 or 503) and the reason told to it."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Callers:
    """The rules of `config` for one miner. `subtensor`: the SDK's class (tests: a fake); `clock`: monotonic s."""

    def __init__(self, config: MinerConfig, *, subtensor=None, clock=time.monotonic):
        self.config, self._subtensor, self._clock = config, subtensor, clock
        self._stakes: dict[str, int] = {}
        self._read_at: float | None = None
        self._reading = asyncio.Lock()

    async def check(self, hotkey: str) -> None:
        """Nothing when `hotkey` is served; Refused otherwise."""
        config = self.config
        if config.allow and hotkey not in config.allow:
            raise Refused(403, "this miner does not serve your hotkey")
        least = config.min_caller_stake_rao
        if least is None:
            return
        held = (await self._stakes_now()).get(hotkey)
        if held is None or held < least:
            where = f"subnet {config.netuid} of {config.network}"
            raise Refused(403, f"stake below {config.min_caller_stake_tao} TAO on {where}" +
                          (": your hotkey is not on its metagraph" if held is None else ""))

    async def _stakes_now(self) -> dict[str, int]:
        """hotkey -> stake (rao) on the subnet, read again once the last read is `stake_refresh_s` old."""
        async with self._reading:
            if self._read_at is not None and self._clock() - self._read_at < self.config.stake_refresh_s:
                return self._stakes
            try:
                neurons = await read_neurons(self.config.network, self.config.netuid, subtensor=self._subtensor)
            except BackendError as exc:
                log.warning("cannot read callers' stakes: %s", exc)
                raise Refused(503, "cannot check the caller's stake now") from None
            self._stakes = {neuron.hotkey: int(neuron.total_stake.rao) for neuron in neurons}
            self._read_at = self._clock()
            return self._stakes

"""Miners from the subnet's metagraph: `MetagraphDirectory(config).miners()`.

One SDK call, through the async client: `async with bittensor.Subtensor(network) as client:
await client.subnets.metagraph(netuid, commitments=False)`, which returns the SDK's `Metagraph` (its
`neurons`: `MetagraphNeuron`s with hotkey, coldkey, stakes as `Balance`, and `axon`, the served
"ip:port" or None). Of those, a miner is a neuron that serves an axon (`http://ip:port`) and whose
total stake (as the metagraph reports it, in rao) is at least `min_stake_tao`; the largest stakes
first, at most `max_miners`. Tests replace only the `Subtensor` object (tests/backends/bittensor/test_metagraph.py). The miner's
stake rule for its callers reads the same metagraph through `read_neurons` (miner/callers.py).
"""

from __future__ import annotations

import ipaddress
from decimal import Decimal

from trainmaster.backends.base import BackendError, TransientBackendError
from trainmaster.backends.bittensor import sdk
from trainmaster.backends.bittensor.config import BittensorConfig
from trainmaster.backends.bittensor.directory import Miner

RAO_PER_TAO = 10**9


def stake_rao(tao_text: str) -> int:
    """A TAO amount written as text (`"1.5"`) in whole rao, through Decimal (never a float)."""
    rao = Decimal(tao_text) * RAO_PER_TAO
    if rao != rao.to_integral_value():
        raise ValueError(f"{tao_text!r} TAO is not a whole number of rao")
    return int(rao)


def axon_url(axon: str | None) -> str | None:
    """`http://ip:port` for a served axon ("ip:port", "[v6]:port"); None when nothing usable is served."""
    if not axon or ":" not in axon:
        return None
    host, _, port = axon.rpartition(":")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
        number = int(port)
    except ValueError:
        return None
    if address.is_unspecified or not 0 < number < 65536:
        return None
    return f"http://[{address}]:{number}" if address.version == 6 else f"http://{address}:{number}"


class MetagraphDirectory:
    """The serving miners of `config.netuid` on `config.network`. `subtensor`: the SDK's class (tests: a fake)."""

    def __init__(self, config: BittensorConfig, *, subtensor=None):
        self.config = config
        self._subtensor = subtensor

    async def miners(self) -> list[Miner]:
        neurons = await self._neurons()
        least = stake_rao(self.config.min_stake_tao)
        found = []
        for neuron in neurons:
            url = axon_url(neuron.axon)
            stake = int(neuron.total_stake.rao)
            if url is not None and stake >= least:
                found.append(Miner(hotkey=neuron.hotkey, url=url, coldkey=neuron.coldkey, stake_rao=stake))
        found.sort(key=lambda m: (-m.stake_rao, m.hotkey))
        return found[: self.config.max_miners]

    async def _neurons(self) -> list:
        if self.config.netuid is None:
            raise BackendError("bittensor.netuid is not set: the metagraph of which subnet? (or list bittensor.miners)")
        return await read_neurons(self.config.network, self.config.netuid, subtensor=self._subtensor)


async def read_neurons(network: str, netuid: int, *, subtensor=None) -> list:
    """The neurons of subnet `netuid` on `network`, in one metagraph read (`subtensor`: the SDK's class, tests: a
    fake). TransientBackendError when the chain cannot be reached, BackendError when the subnet does not exist."""
    bt = sdk.bittensor()
    subtensor = subtensor or bt.Subtensor
    unreachable = (bt.RpcConnectionError, bt.ConnectionNotReady, ConnectionError, TimeoutError, OSError)
    try:
        async with subtensor(network) as client:
            graph = await client.subnets.metagraph(netuid, commitments=False)
    except unreachable as exc:
        raise TransientBackendError(f"the {network} chain is unreachable (reading the metagraph of subnet "
                                    f"{netuid}): {exc}") from None
    if graph is None:
        raise BackendError(f"subnet {netuid} does not exist on {network}")
    return list(graph.neurons)

"""A fake `bittensor.Subtensor` at the SDK boundary (its async client's `subnets.metagraph`), answering with the
SDK's own `Metagraph`, `MetagraphNeuron` and `Balance` objects; the `chain` fixture resets and gives it
(tests/backends/bittensor/test_metagraph.py checks its signatures against the SDK's)."""

from __future__ import annotations

import pytest
from bittensor import Balance, Metagraph, MetagraphNeuron, RpcConnectionError
from bittensor.sp_core import Keypair


def _key(uri: str) -> str:
    return Keypair.create_from_uri(uri).ss58_address


def _neuron(uid: int, axon: str | None, stake_rao_: int) -> MetagraphNeuron:
    stake = Balance.from_rao(stake_rao_)
    return MetagraphNeuron(
        uid=uid, hotkey=_key(f"//Hot{uid}"), coldkey=_key(f"//Cold{uid}"), active=True, validator_permit=False,
        last_update=1, block_at_registration=1, rank=0.0, trust=0.0, consensus=0.0, incentive=0.0, dividends=0.0,
        pruning_score=0.0, emission=Balance.from_rao(0), alpha_stake=stake, tao_stake=Balance.from_rao(0),
        total_stake=stake, axon=axon, identity=None, commitment=None)


def _graph(netuid: int, neurons: list[MetagraphNeuron]) -> Metagraph:
    return Metagraph(netuid=netuid, mechid=0, name="train", symbol="t", block=1000, tempo=360, last_step=900,
                     blocks_since_last_step=100, owner_hotkey=_key("//Owner"), owner_coldkey=_key("//OwnerCold"),
                     network_registered_at=1, num_uids=len(neurons), max_uids=256, price=None, moving_price=None,
                     identity=None, neurons=neurons, commitments={}, unregistered_commitments={}, raw={})


class FakeSubnets:
    def __init__(self, chain):
        self.chain = chain

    async def metagraph(self, netuid: int, block=None, *, commitments: bool = True):
        self.chain.asked.append((netuid, block, commitments))
        return self.chain.graphs.get(netuid)


class FakeSubtensor:
    """`bittensor.Subtensor(network)` in async mode: `async with` gives the client."""

    graphs: dict[int, Metagraph] = {}
    asked: list = []
    reachable = True

    def __init__(self, network: str = "finney"):
        self.network = network
        self.subnets = FakeSubnets(type(self))

    async def __aenter__(self):
        if not type(self).reachable:
            raise RpcConnectionError(f"could not connect to {self.network}")
        return self

    async def __aexit__(self, *_exc) -> None:
        return None


@pytest.fixture
def chain():
    FakeSubtensor.graphs, FakeSubtensor.asked, FakeSubtensor.reachable = {}, [], True
    return FakeSubtensor

"""Miners from the subnet's metagraph (backends/bittensor/metagraph.py), at the SDK boundary: only the
`bittensor.Subtensor` object is a fake, answering `subnets.metagraph` with the SDK's own `Metagraph`,
`MetagraphNeuron` and `Balance` objects; its signatures are checked against the SDK's."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from bittensor import Balance, Metagraph, MetagraphNeuron, RpcConnectionError
from bittensor.sp_core import Keypair

from trainmaster.backends.base import BackendError, TransientBackendError
from trainmaster.backends.bittensor.config import BittensorConfig
from trainmaster.backends.bittensor.metagraph import MetagraphDirectory, axon_url, stake_rao


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


def test_the_fake_has_the_sdk_signatures():
    import bittensor
    from bittensor.namespaces import Subnets

    def shape(fn):
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    assert shape(FakeSubnets.metagraph) == shape(Subnets.metagraph)
    assert shape(FakeSubtensor.__init__)[:2] == shape(bittensor.Subtensor.__init__)[:2]
    assert hasattr(bittensor.Subtensor, "__aenter__") and hasattr(bittensor.Subtensor, "__aexit__")


def _miners(chain, **config):
    directory = MetagraphDirectory(BittensorConfig(network="test", netuid=7, **config), subtensor=chain)
    return asyncio.run(directory.miners())


def test_only_serving_miners_with_enough_stake_largest_first(chain):
    chain.graphs[7] = _graph(7, [
        _neuron(0, "10.0.0.1:8091", 5 * 10**9),
        _neuron(1, None, 50 * 10**9),  # serves nothing
        _neuron(2, "10.0.0.3:8091", 1_499_999_999),  # below 1.5 TAO by one rao
        _neuron(3, "[2001:db8::1]:9000", 1_500_000_000),
        _neuron(4, "0.0.0.0:0", 9 * 10**9),  # announced nothing usable
    ])
    miners = _miners(chain, min_stake_tao="1.5")
    assert [(m.hotkey, m.url, m.coldkey, m.stake_rao) for m in miners] == [
        (_key("//Hot0"), "http://10.0.0.1:8091", _key("//Cold0"), 5 * 10**9),
        (_key("//Hot3"), "http://[2001:db8::1]:9000", _key("//Cold3"), 1_500_000_000),
    ]
    assert chain.asked == [(7, None, False)]


def test_at_most_max_miners(chain):
    chain.graphs[7] = _graph(7, [_neuron(uid, f"10.0.1.{uid}:8091", (uid + 1) * 10**9) for uid in range(10)])
    miners = _miners(chain, max_miners=3)
    assert [m.url for m in miners] == ["http://10.0.1.9:8091", "http://10.0.1.8:8091", "http://10.0.1.7:8091"]


def test_an_unreachable_chain_or_a_missing_subnet_is_a_clear_error(chain):
    chain.reachable = False
    with pytest.raises(TransientBackendError, match="the test chain is unreachable .*subnet 7"):
        _miners(chain)
    chain.reachable = True
    with pytest.raises(BackendError, match="subnet 7 does not exist on test"):
        _miners(chain)
    with pytest.raises(BackendError, match="netuid is not set"):
        asyncio.run(MetagraphDirectory(BittensorConfig(network="test"), subtensor=chain).miners())


def test_stake_and_axon_parsing():
    assert stake_rao("0") == 0 and stake_rao("1.000000001") == 1_000_000_001 and stake_rao("12") == 12 * 10**9
    assert axon_url("127.0.0.1:80") == "http://127.0.0.1:80"
    assert axon_url("host.example:80") is None and axon_url("10.0.0.1:70000") is None and axon_url(None) is None

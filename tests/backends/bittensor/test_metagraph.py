"""Miners from the subnet's metagraph (backends/bittensor/metagraph.py), at the SDK boundary: only the
`bittensor.Subtensor` object is a fake, answering `subnets.metagraph` with the SDK's own `Metagraph`,
`MetagraphNeuron` and `Balance` objects; its signatures are checked against the SDK's."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from metagraph_support import FakeSubnets, FakeSubtensor, _graph, _key, _neuron, chain  # noqa: F401 (chain: the fixture)
from trainmaster.backends.base import BackendError, TransientBackendError
from trainmaster.backends.bittensor.config import BittensorConfig
from trainmaster.backends.bittensor.metagraph import MetagraphDirectory, axon_url, stake_rao


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

"""The miner's rule for its callers (backends/bittensor/miner/callers.py): a minimum stake on a subnet's metagraph,
with its allowlist. In process: the real `Miner` app served by aiohttp's test server on 127.0.0.1, real btauth
signatures by real sr25519 keys; only `bittensor.Subtensor` is a fake (tests/backends/bittensor/test_metagraph.py's, answering with the
SDK's own Metagraph, MetagraphNeuron and Balance objects and counting its reads)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from bittensor.sp_core import Keypair
from pydantic import ValidationError

from metagraph_support import FakeSubtensor, _graph, _neuron, chain  # noqa: F401 (chain: the fixture)
from trainmaster.backends.bittensor import auth, protocol
from trainmaster.backends.bittensor.miner.app import Miner
from trainmaster.backends.bittensor.miner.callers import Callers, Refused
from trainmaster.backends.bittensor.miner.config import MinerConfig

RULE = {"min_caller_stake_tao": "1.5", "network": "test", "netuid": 7, "confine": False}
RICH, POOR, STRANGER = (Keypair.create_from_uri(uri) for uri in ("//Hot0", "//Hot1", "//Stranger"))
BELOW = "stake below 1.5 TAO on subnet 7 of test"


@pytest.fixture
def subnet(chain):  # noqa: F811
    """Subnet 7: //Hot0 holds 5 TAO, //Hot1 one rao less than 1.5 TAO; //Stranger is not on it."""
    chain.graphs[7] = _graph(7, [_neuron(0, "10.0.0.1:8091", 5 * 10**9), _neuron(1, None, 1_499_999_999)])
    return chain


def _ask(tmp_path, settings: dict, chain, calls: list) -> list[tuple[int, dict]]:
    """Each (signer, path) GET, in turn, to one real miner app: its (status, json) answers (a function among
    the calls is called there, between two requests)."""
    miner_key = Keypair.create_from_uri("//Miner")

    async def main():
        miner = Miner(tmp_path / "home", miner_key, MinerConfig.model_validate(settings), subtensor=chain)
        answers = []
        async with TestClient(TestServer(miner.app(), host="127.0.0.1")) as client:
            for call in calls:
                if callable(call):
                    call()
                    continue
                signer, path = call
                headers = auth.sign(signer, method="GET", path=path, body=b"", receiver=miner_key.ss58_address)
                async with client.get(path, headers=headers) as response:
                    answers.append((response.status, await response.json()))
        return answers

    return asyncio.run(main())


def test_enough_stake_is_served_less_or_none_is_refused_and_one_read_serves_all(tmp_path, subnet):
    answers = _ask(tmp_path, RULE, subnet, [(RICH, protocol.HELLO), (POOR, protocol.HELLO),
                                            (STRANGER, protocol.HELLO), (RICH, protocol.HELLO)])
    assert answers[0][0] == 200 and answers[0][1]["hotkey"] == Keypair.create_from_uri("//Miner").ss58_address
    assert answers[1] == (403, {"error": BELOW})
    assert answers[2] == (403, {"error": BELOW + ": your hotkey is not on its metagraph"})
    assert answers[3][0] == 200
    assert subnet.asked == [(7, None, False)]  # one metagraph read for the four requests


def test_the_allowlist_and_the_stake_rule_both_apply(tmp_path, subnet):
    allow = [RICH.ss58_address, POOR.ss58_address]
    answers = _ask(tmp_path, {**RULE, "allow": allow}, subnet,
                   [(RICH, protocol.HELLO), (POOR, protocol.HELLO), (STRANGER, protocol.HELLO)])
    assert [status for status, _ in answers] == [200, 403, 403]
    assert answers[1][1] == {"error": BELOW}
    assert answers[2][1] == {"error": "this miner does not serve your hotkey"}


def test_an_unreachable_chain_is_503_and_the_next_request_reads_again(tmp_path, subnet):
    def back():
        subnet.reachable = True

    subnet.reachable = False
    answers = _ask(tmp_path, RULE, subnet, [(RICH, protocol.HELLO), back, (RICH, protocol.HELLO)])
    assert answers[0] == (503, {"error": "cannot check the caller's stake now"})
    assert answers[1][0] == 200 and subnet.asked == [(7, None, False)]  # the failed read never got a metagraph


def test_a_missing_subnet_is_503_too(tmp_path, chain):  # noqa: F811
    answers = _ask(tmp_path, RULE, chain, [(RICH, protocol.HELLO)])
    assert answers == [(503, {"error": "cannot check the caller's stake now"})]
    assert chain.asked == [(7, None, False)]


def test_without_the_rule_the_chain_is_never_read(tmp_path, subnet):
    answers = _ask(tmp_path, {"confine": False}, subnet, [(STRANGER, protocol.HELLO)])
    assert answers[0][0] == 200 and subnet.asked == []


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stakes_are_read_again_only_after_stake_refresh_s_and_never_served_stale(subnet):
    clock = Clock()
    callers = Callers(MinerConfig.model_validate({**RULE, "stake_refresh_s": 60}), subtensor=subnet, clock=clock)

    async def outcome(hotkey: Keypair):
        try:
            await callers.check(hotkey.ss58_address)
            return "served"
        except Refused as refused:
            return refused.status

    assert asyncio.run(outcome(RICH)) == "served" and asyncio.run(outcome(POOR)) == 403
    subnet.graphs[7] = _graph(7, [_neuron(0, None, 5 * 10**9), _neuron(1, None, 1_500_000_000)])  # //Hot1 staked
    clock.now += 59
    assert asyncio.run(outcome(POOR)) == 403 and len(subnet.asked) == 1  # the kept stakes, not read again
    clock.now += 1
    assert asyncio.run(outcome(POOR)) == "served" and len(subnet.asked) == 2
    clock.now += 60
    subnet.reachable = False
    assert asyncio.run(outcome(RICH)) == 503  # stale stakes are not used when the chain cannot be read


def test_the_rule_in_miner_yaml():
    config = MinerConfig.model_validate(RULE)
    assert config.min_caller_stake_rao == 1_500_000_000 and config.stake_refresh_s == 300
    assert MinerConfig().min_caller_stake_rao is None
    for wrong in ({"min_caller_stake_tao": "1.5"},  # no netuid: the stake on which subnet?
                  {**RULE, "min_caller_stake_tao": "1.5e3"}, {**RULE, "min_caller_stake_tao": "0.0000000001"},
                  {**RULE, "min_caller_stake_tao": 1.5}, {**RULE, "stake_refresh_s": 0}):
        with pytest.raises(ValidationError):
            MinerConfig.model_validate(wrong)

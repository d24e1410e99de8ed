"""The Bittensor backend's offers: miners asked for signed quotes at once over real HTTP on 127.0.0.1, each
request btauth-signed with the broker's real hotkey and checked by the miner; a quote believed only when
signed by the hotkey the directory names, for that miner, for us, for this spec, and still valid; a slow
miner left out at the timeout without delaying the others; banned hotkeys and coldkeys never planned."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from typer.testing import CliRunner

from bittensor_quoting import RAO_PER_HOUR, Gate, QuotingMiner, new_wallet
from remote_executor.process import free_port
from trainmaster.backends.base import OfferRequest
from trainmaster.backends.bittensor.backend import BittensorBackend
from trainmaster.backends.bittensor.config import BittensorConfig
from trainmaster.jobs.spec import JobSpec
from trainmaster.wallet.keys import signed_by
from trainmaster.wallet.rates import Rate

RATE = Rate(micro_usd_per_tao=400_000_000, taken_at=time.time(), source="fixed")
SPEC = JobSpec(name="q", entrypoint="python train.py")


@pytest.fixture
def keys(tmp_path):
    """The broker's wallet, and the hotkeys (and coldkeys) of five miners, made without passwords."""
    wallets = tmp_path / "wallets"
    return new_wallet("broker", wallets), [new_wallet(f"miner{i}", wallets) for i in range(5)]


def _config(miners: list[QuotingMiner], wallets, *extra_miners: dict, **settings) -> BittensorConfig:
    listed = [{"hotkey": m.hotkey.ss58_address, "url": m.url, "coldkey": m.coldkey} for m in miners]
    return BittensorConfig(wallet={"name": "broker", "path": str(wallets), "hotkey": "default"},
                           miners=listed + list(extra_miners), **settings)


def _miner(wallet, home, lie="honest", other=None, gate=None) -> QuotingMiner:
    home.mkdir(parents=True, exist_ok=True)
    m = QuotingMiner(hotkey=wallet.hotkey, home=home, lie=lie, other=other, gate=gate)
    m.coldkey = wallet.coldkeypub.ss58_address
    return m


async def _offers(miners: list[QuotingMiner], wallets, *extra_miners: dict, rate=RATE, **settings):
    """The backend's offers from `miners` (started for the call) and `extra_miners` (listed only)."""
    runners = [await m.start() for m in miners]
    try:
        config = _config(miners, wallets, *extra_miners, **settings)
        return await BittensorBackend(config).offers(OfferRequest(spec=SPEC, rate=rate, total_steps=100))
    finally:
        for runner in runners:
            await runner.cleanup()


def test_two_miners_are_asked_at_once_and_a_hanging_third_is_left_out_at_the_timeout(keys, tmp_path):
    broker, wallets = keys
    gate = Gate(2)  # the two honest miners answer only once both were asked: only parallel requests pass
    miners = [_miner(wallets[0], tmp_path / "m0", gate=gate), _miner(wallets[1], tmp_path / "m1", gate=gate),
              _miner(wallets[2], tmp_path / "m2", lie="hang")]
    found = asyncio.run(_offers(miners, tmp_path / "wallets", quote_timeout_s=2.0))
    assert sorted(o.instance for o in found.offers) == sorted(w.hotkey.ss58_address for w in wallets[:2])
    assert found.reasons == [f"miner {wallets[2].hotkey.ss58_address[:8]}…: no quote within 2 s"]
    assert miners[2].asked and miners[2].answered == 0  # it was asked, and never waited for past the timeout
    for m in miners:
        assert m.asked == [broker.hotkey.ss58_address]  # each request verified by the miner as the broker's


def test_an_honest_quote_becomes_an_offer_priced_at_the_brokers_rate(keys, tmp_path):
    broker, wallets = keys
    miners = [_miner(wallets[0], tmp_path / "m0")]
    [offer] = asyncio.run(_offers(miners, tmp_path / "wallets")).offers
    hotkey = wallets[0].hotkey.ss58_address
    assert (offer.backend, offer.instance, offer.region, offer.cpus, offer.memory_mb) == ("bittensor", hotkey,
                                                                                         "subnet", 2, 4096)
    assert offer.price_per_hour_rao == RAO_PER_HOUR and offer.price_per_hour_micro_usd == 800_000_000
    assert offer.quote == {"source": "the miner's signed quote"} and not offer.trusted
    detail = offer.detail
    assert detail["url"] == miners[0].url and detail["coldkey"] == wallets[0].coldkeypub.ss58_address
    assert (detail["rao"], detail["hours"]) == (RAO_PER_HOUR // 2, 0.5)
    signed = detail["signed_quote"]
    assert signed_by(signed["quote"].encode(), signed["signature"], hotkey)
    assert json.loads(signed["quote"])["broker"] == broker.hotkey.ss58_address
    assert offer.valid_until == json.loads(signed["quote"])["valid_until"] > time.time()


@pytest.mark.parametrize("lie, reason", [
    ("unsigned", "its quote is not signed by its hotkey"),
    ("wrong_miner", "its quote names another miner"),
    ("other_broker", "its quote was made for another broker"),
    ("expired", "its quote expired at"),
])
def test_a_lying_quote_gives_a_reason_naming_the_miner_and_no_offer(keys, tmp_path, lie, reason):
    broker, wallets = keys
    miners = [_miner(wallets[0], tmp_path / "m0"), _miner(wallets[1], tmp_path / "m1", lie=lie,
                                                            other=wallets[3].hotkey)]
    found = asyncio.run(_offers(miners, tmp_path / "wallets"))
    assert [o.instance for o in found.offers] == [wallets[0].hotkey.ss58_address]
    [said] = found.reasons
    assert said.startswith(f"miner {wallets[1].hotkey.ss58_address[:8]}…: {reason}"), said


def test_a_miner_that_is_down_gives_a_reason_and_the_others_still_offer(keys, tmp_path):
    broker, wallets = keys
    down = {"hotkey": wallets[1].hotkey.ss58_address, "url": f"http://127.0.0.1:{free_port()}"}
    found = asyncio.run(_offers([_miner(wallets[0], tmp_path / "m0")], tmp_path / "wallets", down))
    assert [o.instance for o in found.offers] == [wallets[0].hotkey.ss58_address]
    [said] = found.reasons
    assert said.startswith(f"miner {wallets[1].hotkey.ss58_address[:8]}… at {down['url']} is unreachable"), said


def test_no_rate_no_miners_and_no_hotkey_are_each_said(keys, tmp_path):
    broker, wallets = keys
    miners = [_miner(wallets[0], tmp_path / "m0")]
    assert asyncio.run(_offers(miners, tmp_path / "wallets", rate=None)).reasons[0].startswith("no TAO/USD rate")
    config = _config(miners, tmp_path / "wallets")
    assert miners[0].asked == []  # nobody is asked a price we could not value
    none = BittensorBackend(config.model_copy(update={"miners": []}))
    [said] = asyncio.run(none.offers(OfferRequest(spec=SPEC, rate=RATE))).reasons
    assert said.startswith("no miners: list them under bittensor.miners")
    keyless = BittensorBackend(config.model_copy(update={"wallet": config.wallet.model_copy(update={"hotkey": "nope"})}))
    [said] = asyncio.run(keyless.offers(OfferRequest(spec=SPEC, rate=RATE))).reasons
    assert said.startswith("no hotkey file at ") and said.split()[4].endswith("/broker/hotkeys/nope")


class Serving:
    """Quoting miners served from a thread of their own, for a CLI run in this process."""

    def __init__(self, miners: list[QuotingMiner]):
        self.miners, self.loop = miners, asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        self.runners = [asyncio.run_coroutine_threadsafe(m.start(), self.loop).result(30) for m in self.miners]
        return self

    def __exit__(self, *exc):
        for runner in self.runners:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def test_the_broker_never_plans_a_banned_hotkey_or_a_banned_coldkeys_miner(keys, tmp_path, tm_home):
    from trainmaster.broker.cli import app

    broker, wallets = keys
    miners = [_miner(w, tmp_path / f"m{i}") for i, w in enumerate(wallets[:3])]
    # a job the audit can replay: only those are offered to untrusted compute (broker/auditability.py)
    (tmp_path / "job.yaml").write_text("name: q\nentrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 100\n")
    (tmp_path / "policy.yaml").write_text("name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\n")
    cli = CliRunner()

    def planned() -> dict:
        done = cli.invoke(app, ["offers", str(tmp_path / "job.yaml"), "--policy", str(tmp_path / "policy.yaml"),
                                "--json"])
        shown = json.loads(done.output[done.output.index("{"):])
        return {row["offer"]["instance"]: row for row in shown["considered"] if row["offer"]["backend"] == "bittensor"}

    with Serving(miners):
        lines = "".join(f"    - hotkey: {m.hotkey.ss58_address}\n      url: {m.url}\n      coldkey: {m.coldkey}\n"
                        for m in miners)
        (tm_home / "config").mkdir(parents=True)
        (tm_home / "config" / "backends.yaml").write_text(
            f"bittensor:\n  wallet:\n    name: broker\n    path: {tmp_path / 'wallets'}\n  miners:\n{lines}")
        before = planned()
        assert set(before) == {m.hotkey.ss58_address for m in miners}
        assert "banned" not in json.dumps(before)
        for args in ([miners[0].hotkey.ss58_address], [miners[1].coldkey, "--coldkey"]):
            assert cli.invoke(app, ["executors", "ban", *args]).exit_code == 0
        after = planned()
    verdicts = {hotkey: row["verdict"] for hotkey, row in after.items()}
    assert verdicts == {miners[0].hotkey.ss58_address: "its executor is banned (trainmaster executors ls)",
                        miners[1].hotkey.ss58_address: "its executor is banned (trainmaster executors ls)",
                        miners[2].hotkey.ss58_address: "chosen"}

"""A job through a real `trainmaster miner serve` process, over the signed protocol only: quote → upload →
dispatch → status until done → the signed commitment (the bytes of outputs/commitment.json) → the challenge
manifest → a download resumed with Range → conclude (countersigned; the segments removed), and a miner
killed with kill -9 and started again that still answers for its attempts and refuses a replay."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from miner_jobs import SLEEPER, conclusion, start, wait_done
from miner_support import MinerClient, MinerProcess, make_wallet
from trainmaster.backends.bittensor import protocol
from trainmaster.wallet.keys import signed_by

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}


@pytest.fixture(scope="module")
def wallets(tmp_path_factory):
    path = tmp_path_factory.mktemp("wallets")
    return make_wallet(path, "miner"), make_wallet(path, "broker")


@pytest.fixture(scope="module")
def miner(tmp_path_factory, wallets):
    """One miner for the tests that run an attempt of their own on it and leave it serving (started once, ~10 s
    on a loaded machine): each test's attempt has an id of its own and ends before the test does."""
    proc = MinerProcess(tmp_path_factory.mktemp("miner"), wallets[0], config=PRICES).start()
    yield proc
    proc.stop()


@pytest.fixture
def own_miner(tmp_path, wallets):
    """A miner of the test's own: the test kills it."""
    proc = MinerProcess(tmp_path / "miner", wallets[0], config=PRICES).start()
    yield proc
    proc.stop()


def test_a_job_runs_commits_is_challenged_downloaded_and_concluded(tmp_path, wallets, miner):
    client = MinerClient(miner, wallets[1])
    secret = start(client, tmp_path, "a1")
    assert wait_done(client, "a1")["phase"] == "succeeded"
    route = lambda template, **kw: protocol.route(template, attempt_id="a1", **kw)  # noqa: E731

    signed = client.call("GET", route(protocol.COMMITMENT)).json()
    committed = (miner.home / "jobs" / "a1" / "outputs" / "commitment.json").read_bytes()
    assert signed["commitment"].encode() == committed
    assert signed_by(committed, signed["signature"], miner.hotkey)
    assert not signed_by(committed, signed["signature"], wallets[1].hotkey.ss58_address)
    assert json.loads(committed)["bundle_sha256"] in {p.stem for p in (miner.home / "bundles").iterdir()}

    outputs = {f["path"]: f for f in client.call("GET", route(protocol.OUTPUTS)).json()["files"]}
    assert outputs["commitment.json"]["sha256"] == hashlib.sha256(committed).hexdigest()
    metrics = client.call("GET", route(protocol.METRICS) + "?offset=0&limit=100").json()
    assert base64.b64decode(metrics["data"]) == (miner.home / "jobs/a1/outputs/metrics.jsonl").read_bytes()[:100]

    files = client.call("POST", route(protocol.CHALLENGE), {"indices": [0]}).json()["files"]
    paths = {f["path"] for f in files}
    assert {"segments/00000000/manifest.json", "segments/00000001/manifest.json"} <= paths
    assert len([p for p in paths if p.startswith("segments/00000000/")]) > 1  # the whole challenged segment
    biggest = max(files, key=lambda f: f["size"])
    url = route(protocol.CHALLENGED_FILE, path=biggest["path"])
    whole = client.call("GET", url)
    assert whole.status == 200 and hashlib.sha256(whole.body).hexdigest() == biggest["sha256"]
    half = biggest["size"] // 2
    rest = client.call("GET", url, headers={"Range": f"bytes={half}-"})
    assert rest.status == 206
    assert rest.headers["Content-Range"] == f"bytes {half}-{biggest['size'] - 1}/{biggest['size']}"
    assert hashlib.sha256(whole.body[:half] + rest.body).hexdigest() == biggest["sha256"]
    beyond = client.call("GET", url, headers={"Range": f"bytes={biggest['size']}-"})
    assert beyond.status == 416

    told = conclusion(wallets[1].hotkey, secret, "a1")
    acknowledged = client.call("POST", route(protocol.CONCLUDE), told)
    assert acknowledged.status == 200, acknowledged.body
    countersignature = acknowledged.json()["countersignature"]
    assert signed_by(told["receipt"].encode(), countersignature, miner.hotkey)
    assert not list((miner.home / "jobs/a1/checkpoints/segments").iterdir())
    again = client.call("POST", route(protocol.CONCLUDE), told)
    assert again.json() == {"countersignature": countersignature}
    other = conclusion(wallets[1].hotkey, secret, "a1", verdict="rejected", amount_rao=0)
    assert client.call("POST", route(protocol.CONCLUDE), other).status == 409
    assert client.call("POST", route(protocol.CHALLENGE), {"indices": [0]}).status == 409
    still = client.call("GET", route(protocol.COMMITMENT)).json()  # what it still answers for
    assert still["commitment"] == signed["commitment"] and signed_by(committed, still["signature"], miner.hotkey)


def test_a_conclusion_with_a_wrong_secret_or_signature_is_refused(tmp_path, wallets, miner):
    client = MinerClient(miner, wallets[1])
    secret = start(client, tmp_path, "a2", entrypoint=SLEEPER)
    route = protocol.route(protocol.CONCLUDE, attempt_id="a2")
    wrong_secret = conclusion(wallets[1].hotkey, secret, "a2")
    wrong_secret["challenge_secret"] = "00" * 32
    assert client.call("POST", route, wrong_secret).status == 422
    forged = {**conclusion(wallets[1].hotkey, secret, "a2"), "broker": wallets[0].hotkey.ss58_address}
    assert client.call("POST", route, forged).status == 422
    told = client.call("POST", route, conclusion(wallets[1].hotkey, secret, "a2", verdict="rejected"))
    assert told.status == 200
    assert wait_done(client, "a2")["phase"] == "cancelled"  # a run still going when concluded is stopped


def test_a_miner_killed_and_restarted_answers_for_its_attempts_and_refuses_replays(tmp_path, wallets, own_miner):
    miner = own_miner
    client = MinerClient(miner, wallets[1])
    start(client, tmp_path, "a3", entrypoint=SLEEPER)
    status = protocol.route(protocol.STATUS, attempt_id="a3")
    captured = client.headers("GET", status)
    assert client.send("GET", status, headers=captured).json()["phase"] == "running"
    assert miner.kill9() >= 2  # the server and the job's keeper, supervisor and process
    miner.restart()
    assert client.send("GET", status, headers=captured).json() == {"error": "ReplayedRequest"}
    after = client.call("GET", status)
    assert after.status == 200
    assert after.json()["phase"] == "failed" and after.json()["cause"] == "lost"

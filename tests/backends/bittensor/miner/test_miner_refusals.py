"""What a real miner process refuses, and with which status: requests that are unsigned, signed for another
miner, replayed, stale or tampered with (401, the check's name only), callers it does not serve (403), another
broker's attempt (403), quotes that are expired, another miner's, made for another broker or for another spec
(422), bundles that do not match their name (422) or are too large (413), file paths that leave their folder or
pass through a link (404), a resent dispatch with another body (409), and one attempt more than it runs at once
(503)."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from miner_jobs import SLEEPER, Secret, bundle, dispatch_body, quote, spec, start, upload, wait_done
from miner_support import MinerClient, MinerProcess, make_wallet
from trainmaster.backends.bittensor import protocol

CONFIG = {"prices": {"rao_per_gpu_hour": {"cpu": 1_000_000}}, "max_bundle_mb": 1, "max_concurrent_jobs": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """One miner serving two brokers (a stranger is not served), with a sleeping job `t1` of the first."""
    root = tmp_path_factory.mktemp("refusals")
    keys = {name: make_wallet(root / "wallets", name) for name in ("miner", "broker", "other", "stranger")}
    allow = [keys["broker"].hotkey.ss58_address, keys["other"].hotkey.ss58_address]
    miner = MinerProcess(root / "miner", keys["miner"], config={**CONFIG, "allow": allow}).start(probe=keys["broker"])
    clients = {name: MinerClient(miner, keys[name]) for name in ("broker", "other", "stranger")}
    start(clients["broker"], root, "t1", entrypoint=SLEEPER)
    yield miner, clients, root
    clients["broker"].call("POST", protocol.route(protocol.CANCEL, attempt_id="t1"))
    miner.stop()


def test_unsigned_misaddressed_replayed_stale_and_tampered_requests_are_401(world):
    from bittensor import http_auth

    miner, clients, _ = world
    client = clients["broker"]
    assert client.send("GET", protocol.HELLO).json() == {"error": "MalformedAuth"}
    elsewhere = MinerClient(miner, client.signer, receiver=clients["other"].signer.hotkey.ss58_address)
    assert elsewhere.call("GET", protocol.HELLO).json() == {"error": "WrongReceiver"}
    headers = client.headers("GET", protocol.HELLO)
    assert client.send("GET", protocol.HELLO, headers=headers).status == 200
    replayed = client.send("GET", protocol.HELLO, headers=headers)
    assert (replayed.status, replayed.json()) == (401, {"error": "ReplayedRequest"})
    stale = http_auth.sign(client.signer, method="GET", path=protocol.HELLO, receiver_ss58=miner.hotkey,
                           nonce_ns=time.time_ns() - 60 * 10**9)
    assert client.send("GET", protocol.HELLO, headers=stale).json() == {"error": "StaleRequest"}
    body = b'{"spec": {}}'
    signed = client.headers("POST", protocol.QUOTE, body)
    tampered = client.send("POST", protocol.QUOTE, body + b" ", headers=signed)
    assert (tampered.status, tampered.json()) == (401, {"error": "BadSignature"})


def test_a_caller_not_in_allow_is_403_and_a_body_over_the_limit_413(world):
    _, clients, _ = world
    refused = clients["stranger"].call("GET", protocol.HELLO)
    assert (refused.status, refused.json()) == (403, {"error": "this miner does not serve your hotkey"})
    huge = clients["broker"].call("POST", protocol.QUOTE, data=b" " * (protocol.MAX_JSON_BYTES + 1))
    assert huge.status == 413


def test_another_broker_can_neither_read_nor_act_on_my_attempt(world):
    _, clients, _ = world
    for method, template in (("GET", protocol.STATUS), ("GET", protocol.LOGS), ("GET", protocol.OUTPUTS),
                             ("POST", protocol.CANCEL), ("GET", protocol.COMMITMENT)):
        answer = clients["other"].call(method, protocol.route(template, attempt_id="t1"))
        assert answer.status == 403, (template, answer.body)
    assert clients["broker"].call("GET", protocol.route(protocol.STATUS, attempt_id="t1")).json()["phase"] == "running"
    assert clients["broker"].call("GET", protocol.route(protocol.STATUS, attempt_id="nope")).status == 404


def test_quotes_that_are_not_this_miners_for_this_broker_and_spec_are_refused(world, tmp_path):
    miner, clients, _ = world
    job, secret, sha256 = spec(SLEEPER), Secret(), "ab" * 32
    other_miner_wallet = make_wallet(tmp_path / "wallets", "miner2")
    second = MinerProcess(tmp_path / "miner2", other_miner_wallet, config={**CONFIG, "quote_valid_s": 1}).start()
    try:
        theirs = quote(MinerClient(second, clients["broker"].signer), job)
        cases = {
            "the quote is not signed by this miner": dispatch_body("q1", job, theirs, sha256, secret),
            "the quote was made for another broker": dispatch_body("q2", job, quote(clients["other"], job), sha256, secret),
            "the spec is not the one quoted": dispatch_body("q3", spec(SLEEPER + " "), quote(clients["broker"], job),
                                                            sha256, secret),
        }
        for reason, body in cases.items():
            answer = clients["broker"].call("POST", protocol.ATTEMPTS, body)
            assert (answer.status, answer.json()) == (422, {"error": reason})
        second_client = MinerClient(second, clients["broker"].signer)
        expiring = quote(second_client, job)
        while time.time() <= expiring.parsed().valid_until:
            time.sleep(0.1)
        answer = second_client.call("POST", protocol.ATTEMPTS, dispatch_body("q4", job, expiring, sha256, secret))
        assert (answer.status, answer.json()) == (422, {"error": "the quote has expired"})
    finally:
        second.stop()


def test_a_bundle_is_kept_only_whole_matching_its_name_and_under_the_limit(world):
    miner, clients, _ = world
    client, bundles = clients["broker"], miner.home / "bundles"
    before = set(os.listdir(bundles))
    data = os.urandom(1000)
    wrong = upload(client, data, sha256=hashlib.sha256(b"something else").hexdigest())
    assert wrong.status == 422 and "sha256" in wrong.json()["error"]
    big = os.urandom((1 << 20) + 1)
    assert upload(client, big).status == 413  # announced too large
    path = protocol.route(protocol.BUNDLE, sha256=hashlib.sha256(big).hexdigest())
    streamed = client.send("PUT", path, iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                           headers=client.headers("PUT", path))
    assert streamed.status == 413  # no length announced: refused mid-stream
    assert set(os.listdir(bundles)) == before  # nothing kept, no partial file left
    assert upload(client, data).json() == {"sha256": hashlib.sha256(data).hexdigest(), "size": 1000}


def test_file_paths_outside_their_folder_or_through_links_are_404(world):
    miner, clients, _ = world
    client, workdir = clients["broker"], miner.home / "jobs" / "t1"
    (workdir / "outputs" / "plain.txt").write_text("fine\n")
    os.symlink(miner.home / "miner.db", workdir / "outputs" / "link.db")
    os.symlink(miner.home, workdir / "outputs" / "home")
    ok = client.call("GET", protocol.route(protocol.OUTPUT_FILE, attempt_id="t1", path="plain.txt"))
    assert (ok.status, ok.body) == (200, b"fine\n")
    for template in (protocol.OUTPUT_FILE, protocol.CHALLENGED_FILE):
        for path in ("../job.log", "..%2Fjob.log", "%2Fetc%2Fpasswd", "link.db", "home/miner.db", "a/../plain.txt",
                     "./plain.txt"):
            answer = client.call("GET", protocol.route(template, attempt_id="t1", path=path))
            assert answer.status == 404, (template, path, answer.status)
    names = {f["path"] for f in client.call("GET", protocol.route(protocol.OUTPUTS, attempt_id="t1")).json()["files"]}
    assert "plain.txt" in names and not names & {"link.db", "home/miner.db"}


def test_a_resent_dispatch_gets_the_same_answer_another_body_409_and_one_too_many_503(world):
    miner, clients, root = world
    client = clients["broker"]
    job = spec(SLEEPER)
    sha256, data = bundle(root / "t2", job)
    assert upload(client, data).status == 200
    body = dispatch_body("t2", job, quote(client, job), sha256, Secret())
    busy = client.call("POST", protocol.ATTEMPTS, body)
    assert busy.status == 503 and "busy" in busy.json()["error"]  # t1 still runs; one at a time here
    client.call("POST", protocol.route(protocol.CANCEL, attempt_id="t1"))
    assert wait_done(client, "t1")["phase"] == "cancelled"
    first = client.call("POST", protocol.ATTEMPTS, body)
    assert first.status == 200, first.body
    assert client.call("POST", protocol.ATTEMPTS, body).body == first.body
    changed = client.call("POST", protocol.ATTEMPTS, body.model_copy(update={"seed": 12}))
    assert changed.status == 409
    assert clients["other"].call("POST", protocol.ATTEMPTS, body).status == 403
    client.call("POST", protocol.route(protocol.CANCEL, attempt_id="t2"))


def test_past_its_disk_limit_a_miner_takes_no_more_bundles(tmp_path):
    keys = {name: make_wallet(tmp_path / "wallets", name) for name in ("miner", "broker")}
    miner = MinerProcess(tmp_path / "miner", keys["miner"], config={**CONFIG, "max_disk_gb": 1e-6}).start()
    try:
        client = MinerClient(miner, keys["broker"])
        small, large = os.urandom(500), os.urandom(1500)  # the limit is 1073 bytes
        assert upload(client, small).status == 200
        full = upload(client, large)
        assert (full.status, full.json()["error"]) == (503, "disk full: this miner keeps at most 1e-06 GiB")
        assert len(os.listdir(miner.home / "bundles")) == 1
    finally:
        miner.stop()

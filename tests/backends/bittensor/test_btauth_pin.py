"""Our btauth/1 signing (backends/bittensor/auth.py, on `bittensor_core` alone, so the broker never pays for
`import bittensor`) is the SDK's, byte for byte: the same payload as `http_auth.build_payload`, the same headers
as `http_auth.sign` but for the (randomised) sr25519 signature, and every request it signs is accepted by the
real `http_auth.verify` — and refused by it once anything signed is changed."""

from __future__ import annotations

import pytest
from bittensor import http_auth
from bittensor.sp_core import Keypair

from trainmaster.backends.bittensor import auth

BROKER, MINER = Keypair.create_from_uri("//Broker"), Keypair.create_from_uri("//Miner")
CASES = [("GET", "/v1/hello", b""), ("POST", "/v1/quote", b'{"spec": {}}'),
         ("get", "/v1/attempts/a.1/outputs/d%20ir/f%C3%A9.bin?offset=7", b""),
         ("PUT", "/v1/bundles/" + "ab" * 32, b""), ("POST", "/v1/attempts", "é".encode() * 1000)]


@pytest.mark.parametrize(("method", "path", "body"), CASES)
def test_our_payload_and_headers_are_the_sdks(method, path, body):
    nonce = 1_700_000_000_123_456_789
    ours = auth.payload(method=method, path=path, body=body, nonce_ns=nonce, sender=BROKER.ss58_address,
                        receiver=MINER.ss58_address)
    assert ours == http_auth.build_payload(scheme="sr25519", method=method, path=path, body=body, nonce_ns=nonce,
                                           sender_ss58=BROKER.ss58_address, receiver_ss58=MINER.ss58_address)
    mine = auth.sign(BROKER, method=method, path=path, body=body, receiver=MINER.ss58_address, nonce_ns=nonce)
    theirs = http_auth.sign(BROKER, method=method, path=path, body=body, receiver_ss58=MINER.ss58_address,
                            nonce_ns=nonce)
    assert {k: v for k, v in mine.items() if k != "X-Bittensor-Signature"} == \
        {k: v for k, v in theirs.items() if k != "X-Bittensor-Signature"}


@pytest.mark.parametrize(("method", "path", "body"), CASES)
def test_the_sdk_verifies_what_we_sign_and_refuses_it_changed(method, path, body):
    headers = auth.sign(BROKER, method=method, path=path, body=body, receiver=MINER.ss58_address)
    caller = http_auth.verify(headers, body, method=method.upper(), path=path, self_hotkey_ss58=MINER.ss58_address,
                              nonce_store=http_auth.InMemoryNonceStore())
    assert caller.hotkey_ss58 == BROKER.ss58_address
    for changed in ({"body": body + b"x"}, {"path": path + "x"}, {"method": "DELETE"}):
        args = {"body": body, "path": path, "method": method.upper(), **changed}
        with pytest.raises(http_auth.BadSignature):
            http_auth.verify(headers, args["body"], method=args["method"], path=args["path"],
                             self_hotkey_ss58=MINER.ss58_address, nonce_store=http_auth.InMemoryNonceStore())


def test_the_broker_path_never_imports_the_sdk(tmp_path):
    """Signing a request, loading the hotkey and checking a miner's signature import `bittensor_core`, not
    the `bittensor` package (its import is most of a second on a busy machine)."""
    import subprocess
    import sys

    from miner_support import make_wallet

    wallet = make_wallet(tmp_path, "broker")
    code = ("import sys; from pathlib import Path; from trainmaster.backends.bittensor import auth; "
            "from trainmaster.wallet.keys import signed_by; "
            f"k = auth.load_hotkey(Path({str(tmp_path / 'broker' / 'hotkeys' / 'default')!r})); "
            "h = auth.sign(k, method='GET', path='/v1/hello', body=b'', receiver=k.ss58_address); "
            "assert signed_by(b'x', '0x' + bytes(k.sign(b'x')).hex(), k.ss58_address); "
            "print('bittensor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
    assert wallet.hotkey.ss58_address  # the same key the SDK reads

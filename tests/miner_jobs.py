"""Jobs and protocol steps the miner tests share: a tiny runtime job that commits segments (the tiny LM
recipe of tests/e2e/test_remote_harness.py), its bundle, and a quote → upload → dispatch sequence through a
MinerClient, with a broker-side conclusion (the secret, its digest, the signed receipt)."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from pathlib import Path

from miner_support import MinerClient
from trainmaster.backends.bittensor import protocol
from trainmaster.jobs.bundle import build_bundle
from trainmaster.jobs.spec import JobSpec

TINY_LM = ("python -m trainmaster.jobs.recipes.tiny_lm --steps 50 --d-model 16 --layers 1 --seq-len 8 "
           "--batch-size 4 --warmup 5")
SLEEPER = "python -c 'import time; time.sleep(120)'"
DEADLINE_S = 240.0


def spec(entrypoint: str = TINY_LM, **extra) -> dict:
    """The tiny LM's spec (the runtime's self-check off: these tests prove the miner's protocol, not the recipe)."""
    return JobSpec.model_validate({"name": "tiny", "entrypoint": entrypoint, "seed": 3,
                                   "checkpoint": {"segment_steps": 25, "selfcheck": False}, **extra}).model_dump(mode="json")


def bundle(root: Path, job: dict) -> tuple[str, bytes]:
    """The job's bundle (a code folder with one file): its sha256 and bytes."""
    code = root / "code"
    code.mkdir(parents=True, exist_ok=True)
    (code / "README.txt").write_text("the tiny LM recipe ships with trainmaster\n")
    info = build_bundle(code, JobSpec.model_validate(job).canonical_json(), root / "bundles")
    return info.sha256, info.path.read_bytes()


class Secret:
    """The broker's challenge secret of one attempt and its published digest."""

    def __init__(self):
        self.value = secrets.token_hex(32)
        self.digest = hashlib.sha256(bytes.fromhex(self.value)).hexdigest()


def quote(client: MinerClient, job: dict) -> protocol.SignedQuote:
    answer = client.call("POST", protocol.QUOTE, {"spec": job, "total_steps": 50})
    assert answer.status == 200, answer.body
    return protocol.SignedQuote.model_validate(answer.json())


def upload(client: MinerClient, data: bytes, sha256: str | None = None):
    sha256 = sha256 or hashlib.sha256(data).hexdigest()
    return client.call("PUT", protocol.route(protocol.BUNDLE, sha256=sha256), data=data)


def dispatch_body(attempt_id: str, job: dict, signed: protocol.SignedQuote, bundle_sha256: str,
                  secret: Secret) -> protocol.Dispatch:
    return protocol.Dispatch(attempt_id=attempt_id, job_id=f"job-{attempt_id}", spec=job, quote=signed,
                             bundle_sha256=bundle_sha256, seed=11, challenge_digest=secret.digest)


def start(client: MinerClient, root: Path, attempt_id: str, entrypoint: str = TINY_LM) -> Secret:
    """Quote, upload and dispatch one job; its secret."""
    job = spec(entrypoint)
    sha256, data = bundle(root / attempt_id, job)
    assert upload(client, data).status == 200
    secret = Secret()
    answer = client.call("POST", protocol.ATTEMPTS, dispatch_body(attempt_id, job, quote(client, job), sha256, secret))
    assert answer.status == 200, answer.body
    return secret


def wait_done(client: MinerClient, attempt_id: str) -> dict:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        answer = client.call("GET", protocol.route(protocol.STATUS, attempt_id=attempt_id))
        assert answer.status == 200, answer.body
        if answer.json()["phase"] in ("succeeded", "failed", "cancelled"):
            return answer.json()
        time.sleep(0.2)
    raise AssertionError(f"attempt {attempt_id} did not end within {DEADLINE_S:.0f} s")


def conclusion(broker_key, secret: Secret, attempt_id: str, verdict: str = "accepted", amount_rao: int = 500) -> dict:
    """What a broker tells the miner after its verdict, the receipt signed with `broker_key` (a Keypair)."""
    receipt = json.dumps({"attempt_id": attempt_id, "verdict": verdict, "amount_rao": amount_rao,
                          "challenge_digest": secret.digest}, sort_keys=True, separators=(",", ":"))
    signature = "0x" + bytes(broker_key.sign(receipt.encode())).hex()
    return {"verdict": verdict, "amount_rao": amount_rao, "challenge_secret": secret.value, "receipt": receipt,
            "signature": signature, "broker": broker_key.ss58_address}

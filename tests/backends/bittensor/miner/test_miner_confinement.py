"""A stranger's job on a miner cannot read the miner's wallet, its home or another job: through a real
`trainmaster miner serve` process over the signed protocol, a job that tries is denied, and the same job on a
miner told `confine: false` reads them (so the check can fail)."""

from __future__ import annotations

import json

import pytest

from miner_jobs import Secret, dispatch_body, quote, spec, upload, wait_done
from miner_support import MinerClient, MinerProcess, make_wallet
from trainmaster.backends.bittensor import protocol
from trainmaster.jobs.bundle import build_bundle
from trainmaster.jobs.spec import JobSpec

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}
PROBE = """\
import json, os, pathlib, sys
seen = {}
for name, path in json.loads(sys.argv[1]).items():
    try:
        p = pathlib.Path(path)
        seen[name] = sorted(os.listdir(p)) if p.is_dir() else p.read_text()
    except OSError as exc:
        seen[name] = type(exc).__name__
seen["uid"] = os.getuid()
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "seen.json").write_text(json.dumps(seen))
"""


def _probe(client: MinerClient, root, attempt_id: str, targets: dict[str, str]) -> dict:
    code = root / attempt_id / "code"
    code.mkdir(parents=True)
    (code / "probe.py").write_text(PROBE)
    job = spec(f"python probe.py '{json.dumps(targets)}'")
    info = build_bundle(code, JobSpec.model_validate(job).canonical_json(), root / attempt_id / "bundles")
    assert upload(client, info.path.read_bytes()).status == 200
    answer = client.call("POST", protocol.ATTEMPTS,
                         dispatch_body(attempt_id, job, quote(client, job), info.sha256, Secret()))
    assert answer.status == 200, answer.body
    assert wait_done(client, attempt_id)["phase"] == "succeeded"
    got = client.call("GET", protocol.route(protocol.OUTPUT_FILE, attempt_id=attempt_id, path="seen.json"))
    assert got.status == 200, got.body
    return json.loads(got.body)


@pytest.mark.parametrize("confine", [True, False])
def test_a_job_cannot_read_the_miners_wallet_home_or_other_jobs(tmp_path, confine):
    wallets = tmp_path / "wallets"
    miner_wallet, broker = make_wallet(wallets, "miner"), make_wallet(wallets, "broker")
    proc = MinerProcess(tmp_path / "miner", miner_wallet, config={**PRICES, "confine": confine}).start()
    try:
        client = MinerClient(proc, broker)
        hotkey_file = wallets / "miner" / "hotkeys" / "default"
        first = _probe(client, tmp_path / "broker", "a1", {})
        targets = {"hotkey": str(hotkey_file), "home": str(proc.home),
                   "other job": str(proc.home / "jobs" / "a1" / "outputs")}
        seen = _probe(client, tmp_path / "broker", "a2", targets)
    finally:
        proc.stop()
    secret = json.loads(hotkey_file.read_text())["secretPhrase"]
    if confine:
        assert seen["uid"] != 0 and first["uid"] != 0  # an unprivileged user (one per running job)
        assert seen["hotkey"] in ("FileNotFoundError", "PermissionError", ""), seen
        # of the miner's home only the way to its own folder shows; no other job's folder at all
        assert seen["home"] in ([], ["jobs"], "FileNotFoundError", "PermissionError"), seen
        assert seen["other job"] in ([], "FileNotFoundError", "PermissionError"), seen
        assert secret not in json.dumps(seen)
    else:  # the same probe unconfined reads them all: the assertions above can fail
        assert secret in seen["hotkey"] and "miner.db" in seen["home"] and "seen.json" in seen["other job"]

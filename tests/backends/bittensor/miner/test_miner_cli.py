"""`trainmaster miner serve` refuses to start with one clear line and exit 2: a wallet or hotkey that is not
there, a miner.yaml with a mistake (named by file, line and field), a port already in use. Its quotes are
priced from its miner.yaml: rao per GPU-hour (or CPU-hour) × hours, rounded up to a whole rao."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from miner_jobs import spec
from miner_support import MinerClient, MinerProcess, make_wallet
from trainmaster.backends.bittensor import protocol
from trainmaster.wallet.keys import signed_by


@pytest.fixture
def wallet(tmp_path):
    return make_wallet(tmp_path / "wallets", "miner")


def _serve(*args: str, home) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "miner", "serve", "--home", str(home),
                           *args], capture_output=True, text=True, timeout=120,
                          env={"TRAINMASTER_HOME": str(home), "PATH": "/usr/bin:/bin"})


def test_a_missing_wallet_or_hotkey_exits_2_with_one_line(tmp_path, wallet):
    done = _serve("--wallet", "nobody", "--wallet-path", str(tmp_path / "wallets"), home=tmp_path / "m")
    assert done.returncode == 2
    assert "no hotkey 'default' in wallet 'nobody'" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = _serve("--wallet", "miner", "--hotkey", "other", "--wallet-path", str(tmp_path / "wallets"),
                  home=tmp_path / "m")
    assert done.returncode == 2 and "no hotkey 'other' in wallet 'miner'" in done.stderr


def test_a_bad_config_is_named_by_file_line_and_field(tmp_path, wallet):
    config = tmp_path / "miner.yaml"
    config.write_text("prices:\n  rao_per_gpu_hour:\n    cpu: 10\nmax_concurent_jobs: 2\n")
    done = _serve("--wallet", "miner", "--wallet-path", str(tmp_path / "wallets"), "--config", str(config),
                  home=tmp_path / "m")
    assert done.returncode == 2
    assert f"{config}:4: max_concurent_jobs: unknown field; did you mean 'max_concurrent_jobs'?" in done.stderr
    config.write_text("prices:\n  rao_per_gpu_hour:\n    cpu: 1.5\n")
    done = _serve("--wallet", "miner", "--wallet-path", str(tmp_path / "wallets"), "--config", str(config),
                  home=tmp_path / "m")
    assert done.returncode == 2 and f"{config}:3: prices.rao_per_gpu_hour.cpu:" in done.stderr


def test_a_port_in_use_exits_2(tmp_path, wallet):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve("--wallet", "miner", "--wallet-path", str(tmp_path / "wallets"), "--port", str(port),
                      home=tmp_path / "m")
    assert done.returncode == 2 and f"port {port} on 127.0.0.1 is in use" in done.stderr


def test_a_quote_is_the_configured_price_for_the_jobs_hours_signed_for_the_caller(tmp_path, wallet):
    miner = MinerProcess(tmp_path / "miner", wallet, config={
        "prices": {"rao_per_gpu_hour": {"cpu": 1_000_000_007}}, "default_hours": 0.5, "quote_valid_s": 300}).start()
    try:
        broker = make_wallet(tmp_path / "wallets", "broker")
        client = MinerClient(miner, broker)
        for extra, hours, rao in (({}, 0.5, 500_000_004), ({"limits": {"max_hours": 2}}, 2.0, 2_000_000_014),
                                  ({"estimated_hours": 0.1, "limits": {"max_hours": 2}}, 0.1, 100_000_001)):
            job = spec(**extra)
            answer = client.call("POST", protocol.QUOTE, {"spec": job, "total_steps": 50})
            signed = protocol.SignedQuote.model_validate(answer.json())
            assert signed_by(signed.quote.encode(), signed.signature, miner.hotkey)
            quote = signed.parsed()
            assert quote.rao == rao  # estimated_hours, else limits.max_hours, else default_hours; rounded up
            assert (quote.miner, quote.broker, quote.hours, quote.gpu_count) == (
                miner.hotkey, broker.hotkey.ss58_address, hours, 0)
            assert quote.spec_sha256 == protocol.spec_sha256(job)
        gpu = client.call("POST", protocol.QUOTE, {"spec": spec(resources={"gpus": 8})})
        assert gpu.status == 422 and "needs 8 GPU(s)" in gpu.json()["error"]
        invalid = client.call("POST", protocol.QUOTE, {"spec": {"name": "UPPER", "entrypoint": "x"}})
        assert invalid.status == 422 and invalid.json()["error"].startswith("not a valid job spec: name:")
    finally:
        miner.stop()

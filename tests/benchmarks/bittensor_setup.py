"""What the Bittensor benchmark stands on: farms of reference miners (miner_farm.py) started and stopped, a
real `trainmaster miner serve` process, the broker's wallet and its BittensorBackend over a list of miners."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).parent
TESTS = HERE.parent
sys.path.insert(0, str(TESTS))
START_S = 180.0
RATE_MICRO_USD_PER_TAO = 400_000_000
PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 100_000_000}}, "default_hours": 0.25}


@contextmanager
def farms(root: Path, counts: list[int]):
    """Miner farms of these sizes (one process each); yields each farm's miners ({hotkey, coldkey, url} each)."""
    from miner_farm import ready_file

    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TRAINMASTER_HOME": str(root / "farm-home")}
    procs, firsts, first = [], [], 0
    try:
        for count in counts:
            log = open(root / f"farm-{first}.log", "wb")
            procs.append(subprocess.Popen([sys.executable, str(HERE / "miner_farm.py"), str(root), str(first), str(count)],
                                          env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log))
            firsts.append(first)
            first += count
        deadline = time.monotonic() + START_S
        while not all(ready_file(root, f).exists() for f in firsts):
            for proc, f in zip(procs, firsts):
                if proc.poll() is not None:
                    raise RuntimeError(f"farm {f} exited: {(root / f'farm-{f}.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the miner farms did not start within {START_S:.0f} s")
            time.sleep(0.1)
        yield [json.loads(ready_file(root, f).read_text()) for f in firsts]
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def broker_wallet(root: Path):
    from miner_support import make_wallet

    return make_wallet(root / "broker-wallets", "broker")


def backend(wallet, miners: list[dict], **settings):
    """The broker's BittensorBackend as backends.yaml would make it: our wallet, these miners listed."""
    from trainmaster.backends.bittensor.backend import BittensorBackend
    from trainmaster.backends.bittensor.config import BittensorConfig

    config = BittensorConfig(wallet={"name": wallet.name, "path": str(wallet.path), "hotkey": "default"},
                             miners=miners, **settings)
    return BittensorBackend(config)


def rate():
    from trainmaster.wallet.rates import Rate

    return Rate(micro_usd_per_tao=RATE_MICRO_USD_PER_TAO, taken_at=time.time(), source="fixed")


@contextmanager
def miner_process(root: Path, name: str):
    """A real `trainmaster miner serve` process (its own home and wallet); yields it and its listing."""
    from miner_support import MinerProcess, make_wallet

    proc = MinerProcess(root / name, make_wallet(root / "miner-wallets", name), config=PRICES).start()
    try:
        yield proc, {"hotkey": proc.hotkey, "url": proc.url, "coldkey": proc.wallet.coldkeypub.ss58_address}
    finally:
        proc.stop()

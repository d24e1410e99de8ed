"""Many reference miners in one process, for the quote benchmarks: a subnet's worth of miner processes
(~340 MB and ~4 s of start-up each) does not fit on a small machine, so each farm process serves COUNT
miners of the reference miner's own code (`backends.bittensor.miner.app.Miner`: btauth on every request
with its SQLite nonce store, quotes priced from its settings and signed with its hotkey), each with its own
wallet (made without a password), home and port on 127.0.0.1. The broker side is not changed at all.

    python miner_farm.py ROOT FIRST COUNT    # miners FIRST .. FIRST+COUNT-1; ROOT/farm-FIRST.json lists them

The list ({hotkey, coldkey, url} each) is written once every miner listens; SIGTERM stops the farm.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}


def ready_file(root: Path, first: int) -> Path:
    return root / f"farm-{first}.json"


def make_wallet(path: Path, name: str):
    from bittensor.wallet import Wallet

    return (Wallet(name, "default", path=str(path))
            .create_new_coldkey(use_password=False, overwrite=True, suppress=True)
            .create_new_hotkey(use_password=False, overwrite=True, suppress=True))


async def serve(root: Path, first: int, count: int) -> None:
    from aiohttp import web

    from trainmaster.backends.bittensor.miner.app import Miner
    from trainmaster.backends.bittensor.miner.config import MinerConfig
    from trainmaster.backends.bittensor.miner.serve import load_hotkey

    config = MinerConfig.model_validate(PRICES)
    runners, listed = [], []
    for i in range(first, first + count):
        wallet = make_wallet(root / "wallets", f"miner{i}")
        hotkey = load_hotkey(wallet.name, "default", root / "wallets")  # as `trainmaster miner serve` loads it
        home = root / f"miner{i}"
        home.mkdir(parents=True, exist_ok=True)
        runner = web.AppRunner(Miner(home, hotkey, config).app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        listed.append({"hotkey": hotkey.ss58_address, "coldkey": wallet.coldkeypub.ss58_address,
                       "url": f"http://127.0.0.1:{runner.addresses[0][1]}"})
    part = ready_file(root, first).with_suffix(".part")
    part.write_text(json.dumps(listed))
    part.rename(ready_file(root, first))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()


if __name__ == "__main__":
    root_arg, first_arg, count_arg = sys.argv[1:4]
    asyncio.run(serve(Path(root_arg), int(first_arg), int(count_arg)))

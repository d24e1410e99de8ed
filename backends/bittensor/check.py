"""Whether the Bittensor backend can run here: the configured wallet's hotkey is on this machine (requests to
miners are signed with it), and miners can be found (listed in backends.yaml, or a subnet to read them from)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trainmaster.backends.bittensor.config import BittensorConfig


def hotkey_file(config: BittensorConfig) -> Path:
    wallet = config.wallet
    return Path(wallet.path).expanduser() / wallet.name / "hotkeys" / wallet.hotkey


def check(config: BittensorConfig) -> list[str]:
    return hotkey_missing(config) + miners_missing(config)


def hotkey_missing(config: BittensorConfig) -> list[str]:
    path = hotkey_file(config)
    if path.is_file():
        return []
    return [f"no hotkey file at {path} (create it with `btcli wallet new-hotkey`, or set bittensor.wallet)"]


def miners_missing(config: BittensorConfig) -> list[str]:
    """Why no miner can be found, if none can (the metagraph module is looked up, never imported)."""
    if config.miners:
        return []
    if config.netuid is None:
        return ["no miners: list them under bittensor.miners (hotkey and url), or set bittensor.netuid"]
    if importlib.util.find_spec("trainmaster.backends.bittensor.metagraph") is None:
        return ["finding miners on the subnet's metagraph is not available in this version: "
                "list the miners under bittensor.miners instead"]
    return []


def found(config: BittensorConfig) -> list[str]:
    notes = [f"network: {config.network}" + (f", subnet {config.netuid}" if config.netuid is not None else "")]
    if hotkey_file(config).is_file():
        notes.append(f"hotkey: {hotkey_file(config)}")
    if config.miners:
        notes.append(f"{len(config.miners)} miners listed")
    return notes

"""Whether the configured wallet's hotkey is on this machine (requests to miners are signed with it)."""

from __future__ import annotations

from pathlib import Path

from trainmaster.backends.bittensor.config import BittensorConfig


def hotkey_file(config: BittensorConfig) -> Path:
    wallet = config.wallet
    return Path(wallet.path).expanduser() / wallet.name / "hotkeys" / wallet.hotkey


def check(config: BittensorConfig) -> list[str]:
    path = hotkey_file(config)
    if path.is_file():
        return []
    return [f"no hotkey file at {path} (create it with `btcli wallet new-hotkey`, or set bittensor.wallet)"]


def found(config: BittensorConfig) -> list[str]:
    notes = [f"network: {config.network}" + (f", subnet {config.netuid}" if config.netuid is not None else "")]
    if hotkey_file(config).is_file():
        notes.append(f"hotkey: {hotkey_file(config)}")
    if config.miners:
        notes.append(f"{len(config.miners)} miners listed")
    return notes

"""Bittensor settings (`bittensor:` in backends.yaml): the network and subnet, the wallet that pays
and signs (its keys stay in the wallet folder; only where to find them is kept here), and,
optionally, a fixed list of miners instead of the subnet's metagraph."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trainmaster.backends.base import BackendConfig


def _ss58(value: str) -> str:
    if not re.fullmatch(r"[1-9A-HJ-NP-Za-km-z]{46,48}", value):
        raise ValueError(f"{value!r} is not an ss58 hotkey (5F…, 48 characters)")
    return value


Ss58 = Annotated[str, AfterValidator(_ss58)]


class Wallet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("default", description="Wallet (coldkey) name, as btcli names it.")
    path: str = Field("~/.bittensor/wallets", description="Folder that holds the wallets.")
    hotkey: str = Field("default", description="Hotkey of that wallet used to sign requests.")


class BittensorConfig(BackendConfig):
    network: str = Field("finney", description="finney, test, local, or a ws:// or wss:// endpoint.")
    netuid: int | None = Field(None, ge=0, description="Subnet of the training miners.")
    wallet: Wallet = Field(default_factory=Wallet)
    miners: list[Ss58] = Field(
        default_factory=list, description="Miner hotkeys (ss58) to use instead of the subnet's metagraph."
    )


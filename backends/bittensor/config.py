"""Bittensor settings (`bittensor:` in backends.yaml): the network and subnet, the wallet that pays
and signs (its keys stay in the wallet folder; only where to find them is kept here), and,
optionally, a fixed list of miners instead of the subnet's metagraph."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from trainmaster.backends.base import BackendConfig

SS58_FORMAT = 42  # Bittensor's (Substrate's generic) address prefix, as bittensor.wallets.is_bittensor_address pins it


def _ss58(value: str) -> str:
    """A Bittensor ss58 address, its checksum checked by the SDK's codec (bittensor_core, the Rust core that
    bittensor 11 decodes addresses with; imported only when an address is checked). Without the bittensor
    extra only the shape is checked: the backend cannot run then anyway (`backends check` says so)."""
    if not re.fullmatch(r"[1-9A-HJ-NP-Za-km-z]{46,48}", value):
        raise ValueError(f"{value!r} is not an ss58 hotkey (5F…, 48 characters)")
    try:
        import bittensor_core
    except ImportError:
        return value
    try:
        key = bytes(bittensor_core.ss58_decode(value))
    except ValueError as exc:
        detail = str(exc).removeprefix("invalid ss58 address: ").rstrip(".")
        raise ValueError(f"{value!r} is not a valid ss58 address ({detail}); check it for a typo") from None
    if bittensor_core.ss58_encode(key, SS58_FORMAT) != value:
        raise ValueError(f"{value!r} is an ss58 address of another network, not Bittensor's (format {SS58_FORMAT})")
    return value


Ss58 = Annotated[str, AfterValidator(_ss58)]


def checked_ss58(value: str) -> str:
    """`value` when it is a Bittensor ss58 address, checked as backends.yaml checks one (ValueError: why not)."""
    return _ss58(value)


class Wallet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field("default", description="Wallet (coldkey) name, as btcli names it.")
    path: str = Field("~/.bittensor/wallets", description="Folder that holds the wallets.")
    hotkey: str = Field("default", description="Hotkey of that wallet used to sign requests.")


class StaticMiner(BaseModel):
    """A miner named in backends.yaml: who it is and where it answers (instead of the subnet's metagraph)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hotkey: Ss58 = Field(description="The miner's hotkey (ss58): the receiver of our requests, the key of its statements.")
    url: str = Field(pattern=r"^https?://[^/\s]+/?$", description="Where its miner service answers, e.g. http://10.0.0.5:8091.")
    coldkey: Ss58 | None = Field(None, description="Its owner's coldkey, for bans across hotkeys and for payment.")


class BittensorConfig(BackendConfig):
    network: str = Field("finney", description="finney, test, local, or a ws:// or wss:// endpoint.")
    netuid: int | None = Field(None, ge=0, description="Subnet of the training miners.")
    wallet: Wallet = Field(default_factory=Wallet)
    miners: list[StaticMiner] = Field(
        default_factory=list, description="Miners to use instead of the subnet's metagraph (hotkey and url each)."
    )
    min_stake_tao: str = Field("0", pattern=r"^[0-9]+(\.[0-9]{1,9})?$",
                               description="Leave out metagraph miners with less stake than this (TAO, as text).")
    quote_timeout_s: float = Field(3.0, gt=0, le=60, description="How long one miner may take to quote.")
    status_timeout_s: float = Field(10.0, gt=0, le=120, description=(
        "How long one miner may take to answer how a run goes (status, logs, metrics, its outputs' list); a miner "
        "that does not answer is unreachable, lost past the policy's unreachable_after_s."))
    download_floor_kb_s: float = Field(256.0, gt=0, description=(
        "The slowest a miner may deliver its outputs (kB/s): with download_grace_s, the deadline of a fetch, from "
        "the size it announced; a miner past it is rejected."))
    download_grace_s: float = Field(120.0, gt=0, description="Added to every fetch's deadline (seconds).")
    overrun_grace_s: float = Field(60.0, gt=0, le=86400, description=(
        "How long a miner's run may go past its limit (the spec's max_hours or the hours it quoted, plus a tenth) "
        "to start and upload before the broker ends it: one that still says it runs is rejected (seconds)."))
    max_miners: int = Field(256, ge=1, description="At most this many miners are asked for a quote per plan.")
    payments: Literal["receipt", "tao"] = Field(
        "receipt", description="How an accepted miner is paid: `receipt` (the amount in its signed receipt only) "
                               "or `tao` (a TAO transfer from the wallet's coldkey, exactly once).")
    coldkey_password_file: str | None = Field(
        None, description="File (mode 0600) holding the coldkey's password for `payments: tao`; without it the "
                          "broker asks at its terminal. Never read from the environment.")

"""A quote: the miner's price for a job's whole work, in integer rao, signed with its hotkey.

price = rao_per_gpu_hour[GPU type, or `cpu`] × max(GPUs, 1) × hours, rounded up to a whole rao, where hours
is the spec's estimated_hours, else its limits.max_hours, else the miner's default_hours. The GPU type is the
one the local backend would give the job (its offer for the miner's inventory)."""

from __future__ import annotations

import math
import secrets
import time
from decimal import Decimal

from trainmaster.backends.base import Offer
from trainmaster.backends.bittensor import protocol
from trainmaster.backends.bittensor.miner.config import CPU, MinerConfig
from trainmaster.jobs.signing import sign
from trainmaster.jobs.spec import JobSpec


class Unpriced(ValueError):
    """The miner has no price for what the job needs."""


def hours_of(spec: JobSpec, config: MinerConfig) -> float:
    return spec.estimated_hours or spec.limits.max_hours or config.default_hours


def make_quote(spec_json: dict, spec: JobSpec, offer: Offer, config: MinerConfig, *, miner: str, broker: str,
               total_steps: int | None) -> protocol.Quote:
    key = offer.gpu_type if offer.gpu_count else CPU
    per_gpu = config.prices.rao_per_gpu_hour.get(key)
    if per_gpu is None:
        raise Unpriced(f"this miner sets no price for {key} (prices.rao_per_gpu_hour)")
    rao_per_hour = per_gpu * max(offer.gpu_count, 1)
    hours = hours_of(spec, config)
    rao = math.ceil(Decimal(rao_per_hour) * Decimal(str(hours)))
    return protocol.Quote(
        quote_id=secrets.token_hex(16), miner=miner, broker=broker, spec_sha256=protocol.spec_sha256(spec_json),
        total_steps=total_steps, gpu_type=offer.gpu_type if offer.gpu_count else None, gpu_count=offer.gpu_count,
        cpus=spec.resources.cpus, memory_mb=spec.resources.memory_gb * 1024 if spec.resources.memory_gb else None,
        rao_per_hour=rao_per_hour, hours=hours, rao=rao, valid_until=int(time.time()) + config.quote_valid_s)


def signed(quote: protocol.Quote, hotkey) -> protocol.SignedQuote:
    data = quote.canonical_json()
    return protocol.SignedQuote(quote=data.decode(), signature=sign(data, hotkey))

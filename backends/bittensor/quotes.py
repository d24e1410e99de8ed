"""Quotes from miners, gathered in parallel, and the offers the broker may believe in them.

Every miner of the directory is asked at once, each within `quote_timeout_s`, so one slow miner
delays no other. A quote is believed only when it is signed by the hotkey the DIRECTORY names for
that miner (never a key the answer names), names that miner and our hotkey, prices this very spec
(its sha256), and is still valid; a miner whose quote fails any of these, that times out or refuses,
gives a reason naming it, never an offer.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from trainmaster.backends.base import BackendError, Offer, OfferRequest
from trainmaster.backends.bittensor import protocol
from trainmaster.backends.bittensor.client import MinerClient
from trainmaster.backends.bittensor.directory import Miner
from trainmaster.wallet.rates import Rate


class QuoteRefused(Exception):
    """This miner gives no offer; the message says why (it starts with the miner's short name)."""


async def gather(miners: list[Miner], signer, broker: str, request: OfferRequest, rate: Rate,
                 timeout_s: float) -> tuple[list[Offer], list[str]]:
    """(offers, reasons) from every miner of `miners`, asked in parallel."""
    spec = request.spec.model_dump(mode="json")
    ask = protocol.QuoteRequest(spec=spec, total_steps=request.total_steps)

    async def one(miner: Miner) -> Offer:
        # the session's own timeout is a backstop only: `wait_for` is the one that says "no quote within"
        client = MinerClient(miner, signer, timeout=aiohttp.ClientTimeout(total=2 * timeout_s, sock_connect=timeout_s))
        try:
            signed = await asyncio.wait_for(client.answer(protocol.SignedQuote, "POST", protocol.QUOTE, ask),
                                            timeout_s)
        except asyncio.TimeoutError:
            raise QuoteRefused(f"{client.who}: no quote within {timeout_s:g} s") from None
        except BackendError as exc:
            raise QuoteRefused(str(exc)) from None
        quote = believed(signed, miner, broker, spec)
        return offer(miner, signed, quote, rate)

    found = await asyncio.gather(*(one(m) for m in miners), return_exceptions=True)
    offers = [f for f in found if isinstance(f, Offer)]
    reasons = [str(f) if isinstance(f, QuoteRefused) else f"miner {m.hotkey[:8]}…: {type(f).__name__}: {f}"
               for m, f in zip(miners, found) if not isinstance(f, Offer)]
    return offers, reasons


def believed(signed: protocol.SignedQuote, miner: Miner, broker: str, spec: dict, now: float | None = None
             ) -> protocol.Quote:
    """The quote in `signed`, when it holds for `miner` and us on this spec now; QuoteRefused otherwise."""
    from trainmaster.wallet.keys import signed_by

    who = f"miner {miner.hotkey[:8]}…"
    if not signed_by(signed.quote.encode(), signed.signature, miner.hotkey):
        raise QuoteRefused(f"{who}: its quote is not signed by its hotkey")
    try:
        quote = signed.parsed()
    except ValueError as exc:
        raise QuoteRefused(f"{who}: its quote is not a valid quote of the protocol ({str(exc)[:200]})") from None
    if quote.miner != miner.hotkey:
        raise QuoteRefused(f"{who}: its quote names another miner ({quote.miner[:8]}…)")
    if quote.broker != broker:
        raise QuoteRefused(f"{who}: its quote was made for another broker ({quote.broker[:8]}…)")
    if quote.spec_sha256 != protocol.spec_sha256(spec):
        raise QuoteRefused(f"{who}: its quote prices another spec")
    if quote.valid_until <= (time.time() if now is None else now):
        raise QuoteRefused(f"{who}: its quote expired at {quote.valid_until}")
    return quote


def offer(miner: Miner, signed: protocol.SignedQuote, quote: protocol.Quote, rate: Rate) -> Offer:
    """The offer of a believed quote: priced per hour in rao and, at the broker's rate, in micro-USD."""
    return Offer(
        backend="bittensor", instance=miner.hotkey, region="subnet", gpu_type=quote.gpu_type,
        gpu_count=quote.gpu_count, cpus=quote.cpus, memory_mb=quote.memory_mb,
        price_per_hour_rao=quote.rao_per_hour, price_per_hour_micro_usd=rate.micro_usd(quote.rao_per_hour),
        job_price_rao=quote.rao, job_price_micro_usd=rate.micro_usd(quote.rao), valid_until=float(quote.valid_until),
        detail={"url": miner.url, "coldkey": miner.coldkey, "signed_quote": signed.model_dump(),
                "rao": quote.rao, "hours": quote.hours},
        quote={"source": "the miner's signed quote"},
    )

"""Quoting miners for the broker's tests: aiohttp servers on 127.0.0.1 that check each request's btauth
signature the way a trainmaster miner does (auth.check, a SQLite nonce store) and answer `quote` with a
quote signed by a real hotkey, honestly or in one of the ways a miner can lie or fail. They quote only:
running a job is the reference miner's (tests/miner_support.py)."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from trainmaster.backends.bittensor import auth, protocol

RAO_PER_HOUR = 2 * 10**9


def new_wallet(name: str, path: Path):
    """A wallet with an unencrypted coldkey and hotkey (tests only)."""
    from bittensor.wallet import Wallet

    return (Wallet(name, "default", path=str(path))
            .create_new_coldkey(use_password=False, overwrite=True, suppress=True)
            .create_new_hotkey(use_password=False, overwrite=True, suppress=True))


@dataclass
class QuotingMiner:
    """One miner: `lie` is how it answers (honest, unsigned, wrong_miner, other_broker, expired, hang), and
    `together` an event it waits on before it answers (set when every miner sharing it has been asked)."""

    hotkey: object
    home: Path
    lie: str = "honest"
    other: object = None
    """Another key, for the lies that need one."""
    asked: list[str] = field(default_factory=list)
    """The caller hotkey of every request it accepted."""
    answered: int = 0
    gate: Gate | None = None
    url: str = ""

    async def start(self) -> web.AppRunner:
        self.nonces = auth.SqliteNonces(self.home / "nonces.sqlite")
        app = web.Application(client_max_size=protocol.MAX_JSON_BYTES)
        app.router.add_post(protocol.QUOTE, self.quote)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return runner

    async def quote(self, req: web.Request) -> web.Response:
        body = await req.read()
        try:
            caller = auth.check(req.headers, body, method=req.method, path=req.path_qs,
                                miner_hotkey=self.hotkey.ss58_address, nonces=self.nonces)
        except auth.AuthRefused as exc:
            return web.json_response({"error": exc.reason}, status=exc.status)
        self.asked.append(caller)
        if self.gate is not None:
            await self.gate.arrive()
        if self.lie == "hang":
            await asyncio.sleep(3600)
        ask = protocol.QuoteRequest.model_validate_json(body)
        self.answered += 1
        return web.json_response(self.signed(ask, caller).model_dump())

    def signed(self, ask: protocol.QuoteRequest, caller: str) -> protocol.SignedQuote:
        miner = self.other.ss58_address if self.lie == "wrong_miner" else self.hotkey.ss58_address
        broker = self.other.ss58_address if self.lie == "other_broker" else caller
        until = int(time.time()) + (-5 if self.lie == "expired" else 600)
        quote = protocol.Quote(quote_id=secrets.token_hex(16), miner=miner, broker=broker,
                               spec_sha256=protocol.spec_sha256(ask.spec), total_steps=ask.total_steps,
                               gpu_type=None, gpu_count=0, cpus=2, memory_mb=4096, rao_per_hour=RAO_PER_HOUR,
                               hours=0.5, rao=RAO_PER_HOUR // 2, valid_until=until)
        key = self.other if self.lie == "unsigned" else self.hotkey
        data = quote.canonical_json()
        return protocol.SignedQuote(quote=data.decode(), signature="0x" + bytes(key.sign(data)).hex())


class Gate:
    """Lets no one through until `n` have arrived: only requests made at once all pass."""

    def __init__(self, n: int):
        self.n, self.event = n, asyncio.Event()

    async def arrive(self) -> None:
        self.n -= 1
        if self.n <= 0:
            self.event.set()
        await self.event.wait()

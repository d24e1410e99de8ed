"""The request target the broker signs is the one a miner's aiohttp server receives (btauth covers the
path exactly as sent), for every file name a manifest may announce; and the file's name comes out whole."""

from __future__ import annotations

import asyncio
import string

import aiohttp
from aiohttp import web

from trainmaster.backends.bittensor import protocol
from trainmaster.backends.bittensor.client import target

NAMES = [f"dir {c}/file{c}.bin" for c in string.punctuation if c != "/"] + [
    "ünïcode/ß.txt", "emoji/😀.pt", "percent/%41%2F.txt", "segments/00000000/model.safetensors"]


def test_the_signed_target_of_any_announced_file_is_the_one_received():
    received = []

    async def handler(req: web.Request) -> web.Response:
        received.append((req.path_qs, req.match_info["path"]))
        return web.json_response({})

    async def run():
        app = web.Application()
        app.router.add_get(protocol.OUTPUT_FILE, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        sent = [target(protocol.OUTPUT_FILE, {"offset": 7}, attempt_id="j.1", path=name) for name in NAMES]
        try:
            async with aiohttp.ClientSession() as session:
                for one in sent:
                    async with session.get(base + one) as r:
                        assert r.status == 200, one
        finally:
            await runner.cleanup()
        return sent

    sent = asyncio.run(run())
    assert [path_qs for path_qs, _ in received] == sent
    assert [name for _, name in received] == NAMES

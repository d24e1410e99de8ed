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


def test_a_5xx_passes_an_oversized_or_non_json_answer_is_the_miners_fault():
    """A real aiohttp server answering as a failing miner would: a 500 is a fault that may pass (retried, then
    waited on; nobody banned); an answer over the protocol's limit, or not JSON, is the miner's fault (banned);
    a large honest answer (many network chunks) is read whole."""
    from bittensor.sp_core import Keypair

    from trainmaster.backends.base import ExecutorFault, TransientBackendError
    from trainmaster.backends.bittensor.client import MinerClient
    from trainmaster.backends.bittensor.directory import Miner
    from trainmaster.broker.failures import reaction

    many = {"files": [{"path": f"segments/{i:08d}/manifest.json", "size": i, "sha256": "ab" * 32} for i in range(5000)]}
    answers = {"/v1/hello": web.json_response({"error": "disk on fire"}, status=500),
               "/v1/attempts/a1/outputs": web.json_response(many),  # ~0.5 MB: honest, read whole
               "/v1/quote": web.Response(body=b"x" * (protocol.MAX_JSON_BYTES + 1)),
               "/v1/attempts": web.Response(text="<html>oops</html>")}

    async def handler(req: web.Request) -> web.Response:
        await req.read()
        return answers[req.path]

    async def run():
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        miner_key = Keypair.create_from_uri("//Miner")
        client = MinerClient(Miner(hotkey=miner_key.ss58_address, url=f"http://127.0.0.1:{port}"),
                             Keypair.create_from_uri("//Broker"))
        whole = await client.answer(protocol.Files, "GET", "/v1/attempts/a1/outputs")
        got = [len(whole.files)]
        for method, path in (("GET", protocol.HELLO), ("POST", protocol.QUOTE), ("POST", protocol.ATTEMPTS)):
            try:
                await client.call(method, path)
            except Exception as exc:  # noqa: BLE001 - each kind is asserted below
                got.append(exc)
        await runner.cleanup()
        return got

    files, failed, oversized, not_json = asyncio.run(run())
    assert files == 5000  # an answer of many chunks is read to its end
    assert isinstance(failed, TransientBackendError) and "500 disk on fire" in str(failed)
    assert not reaction(failed, trusted=False).ban
    assert isinstance(oversized, ExecutorFault) and "larger than" in str(oversized)
    assert isinstance(not_json, ExecutorFault) and "not JSON" in str(not_json)
    assert reaction(oversized, trusted=False).ban and reaction(not_json, trusted=False).ban

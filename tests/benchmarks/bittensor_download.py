"""The two sides of the artifact-download benchmark, each a process of its own so its peak RSS is its own:

    python bittensor_download.py ours   JOB.json   # the broker: a miner's outputs/{path} (Range route, btauth)
                                                   #   → backends.transfer.download, as BittensorBackend.fetch
    python bittensor_download.py raw    URL DEST   # the bar: a plain aiohttp GET written to DEST, nothing checked
    python bittensor_download.py curl   URL DEST   # the other bar: `curl -o DEST URL` (C, no event loop), then fsync
    python bittensor_download.py serve  FILE       # the bar's server: aiohttp's FileResponse (sendfile); prints its URL

A client prints one JSON line: seconds, bytes, its peak RSS (ru_maxrss) and its RSS before the transfer (after
its imports), and the longest the event loop went without running a 5 ms ticker (a write or hash done on the
loop shows here).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

TICK_S = 0.005


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


async def timed(transfer) -> dict:
    """Run `transfer` (a coroutine) beside a ticker; its figures."""
    stall = 0.0
    before = rss_mb()

    async def ticker():
        nonlocal stall
        while True:
            start = time.perf_counter()
            await asyncio.sleep(TICK_S)
            stall = max(stall, time.perf_counter() - start - TICK_S)

    ticking = asyncio.create_task(ticker())
    started = time.perf_counter()
    size = await transfer
    seconds = time.perf_counter() - started
    ticking.cancel()
    return {"seconds": seconds, "bytes": size, "rss_before_mb": before,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "max_loop_stall_ms": stall * 1e3}


def ours(job: dict):
    """The download as a coroutine, its modules imported first (so "before" counts them)."""
    from trainmaster.backends import transfer
    from trainmaster.backends.bittensor import protocol
    from trainmaster.backends.bittensor.client import MinerClient, target
    from trainmaster.backends.bittensor.directory import Miner
    from trainmaster.backends.bittensor.miner.serve import load_hotkey

    signer = load_hotkey(job["wallet"], "default", job["wallet_path"])
    client = MinerClient(Miner(hotkey=job["hotkey"], url=job["url"]), signer)
    read = client.reader(target(protocol.OUTPUT_FILE, attempt_id=job["attempt_id"], path=job["path"]))

    async def download() -> int:
        got = await transfer.download(read, Path(job["dest"]), size=job["size"], sha256=job["sha256"])
        return got.size

    return download()


async def raw(url: str, dest: str) -> int:
    import aiohttp

    size = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.get(url) as r:
            r.raise_for_status()
            with open(dest, "wb") as sink:
                async for chunk in r.content.iter_chunked(1 << 16):
                    sink.write(chunk)
                    size += len(chunk)
                sink.flush()
                os.fsync(sink.fileno())
    return size


async def serve(path: str) -> None:
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/file", lambda _request: web.FileResponse(path))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}/file", flush=True)
    await asyncio.Event().wait()


def curl(url: str, dest: str) -> dict:
    import subprocess

    started = time.perf_counter()
    subprocess.run(["curl", "-sSf", "-o", dest, url], check=True)
    fd = os.open(dest, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"seconds": time.perf_counter() - started, "bytes": os.path.getsize(dest)}


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "serve":
        asyncio.run(serve(args[0]))
    elif mode == "curl":
        print(json.dumps(curl(*args)))
    else:
        work = ours(json.loads(Path(args[0]).read_text())) if mode == "ours" else raw(*args)
        print(json.dumps(asyncio.run(timed(work))))

"""Bittensor backend (issue #17): quotes, artifact download, and a DQN job end to end through a miner.

1. Quote round trip against 16 miners (4 from each farm of 2.): one miner's quote as BittensorBackend asks it (quotes.gather for that
   miner: a btauth-signed request, the miner's btauth check with its SQLite nonce store, its priced and signed
   quote, the broker's checks of that signature against the directory's hotkey), median and p99 over every
   miner × rounds; and all 16 at once through `BittensorBackend.offers`.
2. Offers from 256 miners (a full subnet) through `BittensorBackend.offers`, in ≤ 1 s. Setup (both 1 and 2):
   one `trainmaster miner serve` process is ~340 MB and ~4 s of start-up, so the miners are served by a few
   farm processes (miner_farm.py: the reference miner's own app, each miner its own wallet, hotkey, home,
   SQLite nonce store and port on 127.0.0.1); the broker side is unchanged. The first call is a warm-up.
3. A 2 GB artifact from a real `trainmaster miner serve` process (the attempt dispatched by the backend, the
   file written by the job): the miner's outputs/{path} Range route → backends.transfer.download (what
   BittensorBackend.fetch runs per file: btauth, sha256 as it arrives, fsync), in a process of its own, vs a
   raw loopback copy of the same file (aiohttp's FileResponse → a plain aiohttp GET written to disk, fsync, no
   hash; and `curl -o` from the same server, then fsync): throughput ratio ≥ 0.7 (medians, interleaved); the
   broker process's peak RSS ≤ 256 MB; the longest stall of its event loop (a 5 ms ticker), which shows
   whether writes and hashing are off the loop (the plain aiohttp client, which writes on its loop, stalls).
4. bittensor_dqn.py: the shipped DQN job through a miner, from `trainmaster submit --wait`.
5. bittensor_overhead.py: the broker's overhead on this path, submit → the entrypoint's first line on the miner.

Run: python tests/benchmarks/bench_bittensor.py   (a few minutes; smoke: tiny sizes)
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402
from bittensor_setup import HERE, backend, broker_wallet, farms, miner_process, rate  # noqa: E402

FULL = {"farms": [64, 64, 64, 64], "per_farm": 4, "rounds": 20, "subnet_rounds": 5,
        "artifact_bytes": 2 * 2**30, "download_repeat": 3}
SMOKE = {"farms": [4, 4], "per_farm": 2, "rounds": 2, "subnet_rounds": 1,
         "artifact_bytes": 2 * 2**20, "download_repeat": 1}
DEADLINE_S = 600.0
MAKE_ARTIFACT = """\
import os, sys
size, block = int(sys.argv[1]), os.urandom(4 << 20)
with open(os.path.join(os.environ["TRAINMASTER_OUTPUT_DIR"], "artifact.bin"), "wb") as f:
    for start in range(0, size, len(block)):
        f.write(block[: min(len(block), size - start)])
"""


def request(spec=None, steps: int = 100):
    from trainmaster.backends.base import OfferRequest
    from trainmaster.jobs.spec import JobSpec

    spec = spec or JobSpec(name="bench", entrypoint="python train.py")
    return OfferRequest(spec=spec, rate=rate(), total_steps=steps)


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def quote_times(tm, rounds: int) -> tuple[list[float], list[float]]:
    """(one miner's quote round trips, every miner at once through offers), in seconds."""
    from trainmaster.backends.bittensor import quotes

    ask, miners, signer = request(), await tm.directory().miners(), tm.signer()
    await tm.offers(ask)  # warm-up: the signer, the imports, the first connections
    one, together = [], []
    for _ in range(rounds):
        for miner in miners:
            started = time.perf_counter()
            offers, reasons = await quotes.gather([miner], signer, signer.ss58_address, ask, ask.rate,
                                                  tm.config.quote_timeout_s)
            one.append(time.perf_counter() - started)
            assert len(offers) == 1 and not reasons, reasons
        together.append(await all_offers(tm, ask, len(miners)))
    return one, together


async def all_offers(tm, ask, expected: int) -> float:
    started = time.perf_counter()
    found = await tm.offers(ask)
    seconds = time.perf_counter() - started
    assert len(found.offers) == expected and not found.reasons, found.reasons[:3]
    return seconds


async def subnet_times(tm, rounds: int) -> list[float]:
    ask = request()
    expected = len(tm.config.miners)
    await all_offers(tm, ask, expected)  # warm-up
    return [await all_offers(tm, ask, expected) for _ in range(rounds)]


def quote_figures(root: Path, sizes: dict) -> dict[str, float]:
    """Both quote figures from one set of farms: the first few miners of every farm, then all of them."""
    wallet = broker_wallet(root)
    with farms(root / "subnet", sizes["farms"]) as served:
        few = [m for farm in served for m in farm[: sizes["per_farm"]]]
        one, together = asyncio.run(quote_times(backend(wallet, few), sizes["rounds"]))
        every = [m for farm in served for m in farm]
        subnet = asyncio.run(subnet_times(backend(wallet, every), sizes["subnet_rounds"]))
    n, m, p = len(few), len(every), len(served)
    return {
        f"{n} miners ({p} farm processes): one quote round trip, median (ms)": statistics.median(one) * 1e3,
        f"{n} miners ({p} farm processes): one quote round trip, p99 (ms)": percentile(one, 99) * 1e3,
        f"{n} miners ({p} farm processes): all at once through offers, median (ms)": statistics.median(together) * 1e3,
        f"{n} miners ({p} farm processes): all at once through offers, p99 (ms)": percentile(together, 99) * 1e3,
        f"{m} miners ({p} farm processes): offers gathered, median (s)": statistics.median(subnet),
        f"{m} miners ({p} farm processes): offers gathered, slowest of {len(subnet)} (s)": max(subnet),
    }


async def dispatch_artifact(tm, root: Path, size: int) -> tuple:
    """The job that writes `size` bytes, dispatched to the backend's one miner and run; (handle, the file's
    manifest entry)."""
    from trainmaster.backends.base import AttemptContext
    from trainmaster.backends.bittensor import protocol
    from trainmaster.backends.bittensor.client import MinerClient, target
    from trainmaster.jobs.bundle import build_bundle
    from trainmaster.jobs.spec import JobSpec

    code = root / "artifact-job"
    code.mkdir()
    (code / "make.py").write_text(MAKE_ARTIFACT)
    spec = JobSpec(name="artifact", entrypoint=f"python make.py {size}")
    bundle = build_bundle(code, spec.canonical_json(), root / "bundles")
    [offer] = (await tm.offers(request(spec))).offers
    ctx = AttemptContext(job_id="artifact-1", attempt_id="artifact-1-a1", bundle_sha256=bundle.sha256, seed=1,
                         workdir=str(root / "attempt"), challenge_digest=hashlib.sha256(b"secret").hexdigest())
    handle = await tm.submit(bundle.path, spec, offer, ctx)
    deadline = time.monotonic() + DEADLINE_S
    while not (status := await tm.status(handle)).phase.done:
        assert time.monotonic() < deadline, "the artifact job did not end"
        await asyncio.sleep(0.5)
    assert status.phase.value == "succeeded", status
    [miner] = await tm.directory().miners()
    client = MinerClient(miner, tm.signer())
    files = await client.answer(protocol.Files, "GET", target(protocol.OUTPUTS, attempt_id=ctx.attempt_id))
    [artifact] = [f for f in files.files if f.path == "artifact.bin"]
    return handle, artifact


def child(*args: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "bittensor_download.py"), *args], capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def download_figures(root: Path, sizes: dict, miner: tuple) -> dict[str, float]:
    """The figures on `miner` ((its process, its listing), from `miner_process`)."""
    root.mkdir(parents=True, exist_ok=True)
    wallet = broker_wallet(root)
    proc, listed = miner
    tm = backend(wallet, [listed])
    handle, artifact = asyncio.run(dispatch_artifact(tm, root, sizes["artifact_bytes"]))
    source = proc.home / "jobs" / handle.data["attempt_id"] / "outputs" / "artifact.bin"
    server = subprocess.Popen([sys.executable, str(HERE / "bittensor_download.py"), "serve", str(source)],
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        job = root / "download.json"
        dest = root / "fetched" / "artifact.bin"
        job.write_text(json.dumps({"wallet": wallet.name, "wallet_path": str(wallet.path), "hotkey": proc.hotkey,
                                   "url": proc.url, "attempt_id": handle.data["attempt_id"],
                                   "path": artifact.path, "size": artifact.size, "sha256": artifact.sha256,
                                   "dest": str(dest)}))
        ours, raw, curl = [], [], []
        for _ in range(sizes["download_repeat"]):  # interleaved, so a busy moment hits all alike
            raw.append(child("raw", url, str(root / "raw.bin")))
            os.unlink(root / "raw.bin")
            curl.append(child("curl", url, str(root / "raw.bin")))
            os.unlink(root / "raw.bin")
            ours.append(child("ours", str(job)))
            assert dest.stat().st_size == artifact.size
            os.unlink(dest)
    finally:
        server.terminate()
        server.wait()
    rate_ours = statistics.median(r["bytes"] / r["seconds"] for r in ours)
    rate_raw = statistics.median(r["bytes"] / r["seconds"] for r in raw)
    rate_curl = statistics.median(r["bytes"] / r["seconds"] for r in curl)
    mb = artifact.size / 2**20
    return {
        f"{mb:.0f} MiB artifact: miner route → transfer.download (MiB/s)": rate_ours / 2**20,
        f"{mb:.0f} MiB artifact: raw loopback copy (MiB/s)": rate_raw / 2**20,
        f"{mb:.0f} MiB artifact: throughput ratio ours / raw": rate_ours / rate_raw,
        f"{mb:.0f} MiB artifact: curl to a file, then fsync (MiB/s)": rate_curl / 2**20,
        f"{mb:.0f} MiB artifact: throughput ratio ours / curl": rate_ours / rate_curl,
        f"{mb:.0f} MiB artifact: broker process peak RSS (MiB)": max(r["peak_rss_mb"] for r in ours),
        f"{mb:.0f} MiB artifact: broker process RSS before the download (MiB)": max(r["rss_before_mb"] for r in ours),
        f"{mb:.0f} MiB artifact: broker event loop longest stall (ms)": max(r["max_loop_stall_ms"] for r in ours),
        f"{mb:.0f} MiB artifact: raw client event loop longest stall (ms)": max(r["max_loop_stall_ms"] for r in raw),
    }


def run(smoke: bool = False) -> dict[str, float]:
    from bittensor_dqn import dqn_figures
    from bittensor_overhead import overhead_figures

    sizes = SMOKE if smoke else FULL
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bittensor-") as tmp:
        figures.update(quote_figures(Path(tmp) / "quotes", sizes))
        # one real miner process for the download, the DQN job and the overhead runs, as one miner serves
        # many brokers' jobs (each phase has a broker wallet and home of its own); ~8 s of start-up each saved
        with miner_process(Path(tmp) / "miner", "miner") as miner:
            figures.update(download_figures(Path(tmp) / "download", sizes, miner))
            figures.update(dqn_figures(Path(tmp) / "dqn", smoke, miner))
            figures.update(overhead_figures(Path(tmp) / "overhead", smoke, miner))
    return figures


TARGETS = {"offers gathered, slowest": "≤ 1 s", "throughput ratio": "≥ 0.7", "peak RSS": "≤ 256 MiB",
           "replay / training": "≤ 0.05", "submit → entrypoint": "≤ 0.5 s"}

if __name__ == "__main__":
    results = run()
    targets = {k: t for k in results for part, t in TARGETS.items() if part in k}
    print_figures("Bittensor: quotes, artifact download, DQN through a miner (127.0.0.1)", results, targets)

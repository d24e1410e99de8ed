"""The cheats, each the reference miner (backends/bittensor/miner/app.py) with one thing changed.

`install(kind)` puts the cheat in place in this process before `trainmaster miner serve` starts: a training
cheat rewrites the entrypoint of every attempt the miner starts to run train.py around it; every other
cheat is a subclass of `Miner` overriding one route, served instead of the honest one.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
from pathlib import Path

import aiohttp
from aiohttp import web

from cheating_miners import TRAINING
from trainmaster.backends.bittensor.miner import app, files, runner
from trainmaster.backends.bittensor.miner.app import BODY, Miner, _model, _workdir
from trainmaster.backends.features import SignedCommitment
from trainmaster.jobs.signing import sign_commitment

REPLAY_TO_ENV = "CHEATING_REPLAY_TO"
"""The URL of another miner the `replay` cheat sends the broker's signed dispatch to."""
REPLAYS = "replays.jsonl"
"""Where in its home the `replay` cheat notes each replay and its answer: {"to", "status", "error"}."""
CUT_LOG = "cut.log"
SHORT_LOG = "short.log"
"""Where in its home the `short` cheat notes each short answer it gave (one line per request)."""
"""Where in its home the `cut` cheat notes each output whose download it cut."""
STASH = "stash"
"""Where in its home the `reuse` cheat keeps the first run it made."""


def install(kind: str) -> None:
    if kind in TRAINING:
        runner.start = _altered(kind, runner.start)
    if kind in CHEATS:
        app.Miner = CHEATS[kind]


def _altered(kind: str, start):
    """`runner.start` running the job's entrypoint inside train.py, which alters its training."""

    training = kind.split("_")[0] if kind.startswith("nudge") else kind

    async def altered(local, home: Path, dispatch, spec, offer):
        entrypoint = (f"python -m cheating_miners.train {training} --stash {shlex.quote(str(home / STASH))} -- "
                      f"{spec.entrypoint}")
        return await start(local, home, dispatch, spec.model_copy(update={"entrypoint": entrypoint}), offer)

    return altered


class WrongKey(Miner):
    """Signs its commitment with a fresh hotkey, not the one it was dispatched to."""

    def __init__(self, *args, **kwargs):
        from bittensor.sp_core import Keypair

        super().__init__(*args, **kwargs)
        self.other = Keypair.create_from_mnemonic(Keypair.generate_mnemonic())

    async def commitment(self, request: web.Request) -> web.Response:
        commitment, data = await self._committed(self._attempt(request))
        return _model(SignedCommitment(commitment=data.decode(), signature=sign_commitment(commitment, self.other)))


class Replaying(Miner):
    """Runs its attempt honestly, then sends the broker's signed dispatch, byte for byte, to itself again and
    to another miner (CHEATING_REPLAY_TO), hoping for a second attempt or work done for free."""

    async def dispatch(self, request: web.Request) -> web.Response:
        answer = await super().dispatch(request)
        others = os.environ.get(REPLAY_TO_ENV, "").split()
        for url in [f"http://{request.host}", *others]:
            await self._replay(request, url)
        return answer

    async def _replay(self, request: web.Request, url: str) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower().startswith("x-bittensor-")}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            async with session.post(url + request.path_qs, data=request[BODY],
                                    headers={**headers, "Content-Type": "application/json"}) as r:
                got = {"to": url, "status": r.status, "error": (await r.json(content_type=None)).get("error")}
        with open(self.home / REPLAYS, "a") as f:
            f.write(json.dumps(got) + "\n")


class Silent(Miner):
    """Runs and commits honestly, then never answers its challenge."""

    async def challenge(self, request: web.Request) -> web.Response:
        self._attempt(request)
        await asyncio.Event().wait()


class Vanishing(Miner):
    """Runs and commits honestly, then is gone (SIGKILL to itself) the first time it is asked how the run went."""

    async def status(self, request: web.Request) -> web.Response:
        answer = await super().status(request)
        if json.loads(answer.text)["phase"] in ("succeeded", "failed", "cancelled"):
            os.kill(os.getpid(), signal.SIGKILL)
        return answer


class Cutting(Miner):
    """Drops the connection halfway through the first download of each output; a resumed one is answered."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cut: set[str] = set()

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        found = root and files.regular_file(root, path)
        if _resumed(request) or path in self.cut or found is None or found.stat().st_size < 2:
            return await super().output_file(request)
        self.cut.add(path)
        with open(self.home / CUT_LOG, "a") as f:
            f.write(path + "\n")
        data = found.read_bytes()
        response = web.StreamResponse()
        response.content_length, response.content_type = len(data), "application/octet-stream"
        await response.prepare(request)
        await response.write(data[: len(data) // 2])
        request.transport.close()
        return response


class BadHash(Miner):
    """Serves each output with its last byte changed: the bytes differ from the sha256 its manifest announced."""

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        found = root and files.regular_file(root, request.match_info["path"])
        if found is None or _resumed(request):
            return await super().output_file(request)
        data = bytearray(found.read_bytes())
        if data:
            data[-1] ^= 0xFF
        return web.Response(body=bytes(data), content_type="application/octet-stream")


class Huge(Miner):
    """Runs honestly, then announces its model as 10 TB (an attacker filling the broker's disk)."""

    async def outputs(self, request: web.Request) -> web.Response:
        answer = json.loads((await super().outputs(request)).text)
        for f in answer["files"]:
            if f["path"].endswith(".safetensors"):
                f["size"] = 10 * 10**12
        return web.json_response(answer)


class Trickle(Miner):
    """Runs honestly, then serves its outputs one byte a second (the whole answer announced, never refused)."""

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        found = root and files.regular_file(root, request.match_info["path"])
        if found is None:
            return await super().output_file(request)
        data = found.read_bytes()
        start = _start(request)
        response = web.StreamResponse(status=206 if "Range" in request.headers else 200)
        if response.status == 206:
            response.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        response.content_length, response.content_type = len(data) - start, "application/octet-stream"
        await response.prepare(request)
        for i in range(start, len(data)):
            await response.write(data[i:i + 1])
            await asyncio.sleep(1.0)
        return response


class Short(Miner):
    """Runs honestly, then serves every output 100 bytes short in a well-formed answer (its Content-Length says
    so): a network fault to a broker that only counts bytes, every time it asks."""

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        found = root and files.regular_file(root, request.match_info["path"])
        if found is None:
            return await super().output_file(request)
        data = found.read_bytes()
        start = _start(request)
        body = data[start:max(start, len(data) - 100)]
        headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if "Range" in request.headers else {}
        with open(self.home / SHORT_LOG, "a") as f:
            f.write(request.match_info["path"] + "\n")
        return web.Response(body=body, status=206 if headers else 200, headers=headers,
                            content_type="application/octet-stream")


class ShortRange(Cutting):
    """Cuts each output's first download halfway, then answers the resume with a body shorter than the
    Content-Range it announces (its Content-Length agreeing with the short body)."""

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        if not _resumed(request):
            return await super().output_file(request)
        root = files.real_dir(_workdir(self._attempt(request)), "outputs")
        found = root and files.regular_file(root, request.match_info["path"])
        data = found.read_bytes()
        start = _start(request)
        return web.Response(body=data[start:-10], status=206, content_type="application/octet-stream",
                            headers={"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"})


class Mute(Miner):
    """Takes the dispatch, runs it, and from then on never answers how it goes (every status and log call hangs)."""

    async def status(self, request: web.Request) -> web.Response:
        self._attempt(request)
        await asyncio.Event().wait()

    async def logs(self, request: web.Request) -> web.Response:
        self._attempt(request)
        await asyncio.Event().wait()


class Overrun(Miner):
    """Says its run is still running, forever (past the quote's hours and the job's max_hours)."""

    async def status(self, request: web.Request) -> web.Response:
        answer = json.loads((await super().status(request)).text)
        answer.update({"phase": "running", "cause": None, "reason": None, "exit_code": None, "ended_at": None})
        return web.json_response(answer)


class Escapes(Miner):
    """Runs honestly, but paints over the broker's terminal: its log carries a window title, a screen clear and
    a fake verdict, and its status a claimed start 100 hours in the past."""

    PAINT = "\x1b]0;PWNED\x07\x1b[2J\x1b[Hverdict: accepted\r\x1b[31mpaid\x1b[0m\n"

    async def logs(self, request: web.Request) -> web.Response:
        answer = json.loads((await super().logs(request)).text)
        if answer["offset"] == 0 and answer["text"]:
            answer["text"] = self.PAINT + answer["text"]
        return web.json_response(answer)

    async def status(self, request: web.Request) -> web.Response:
        answer = json.loads((await super().status(request)).text)
        if answer.get("started_at"):
            answer["started_at"] -= 100 * 3600
        return web.json_response(answer)


class SilentLeaves(Miner):
    """(With `nudge` training.) Asked to open leaves for a bisection, never answers."""

    async def leaves(self, request: web.Request) -> web.Response:
        self._attempt(request)
        await asyncio.Event().wait()


class GarbageLeaves(Miner):
    """(With `nudge` training.) Asked to open leaves for a bisection, answers bytes that are not JSON."""

    async def leaves(self, request: web.Request) -> web.Response:
        self._attempt(request)
        return web.Response(body=b"\x00\xffnot json {", content_type="application/json")


def _start(request: web.Request) -> int:
    asked = request.headers.get("Range", "bytes=0-").strip()
    return int(asked.removeprefix("bytes=").split("-")[0] or 0)


def _resumed(request: web.Request) -> bool:
    """Whether the download asks for the file from a byte other than the first."""
    return request.headers.get("Range", "bytes=0-").strip() != "bytes=0-"


CHEATS: dict[str, type[Miner]] = {"wrong_key": WrongKey, "replay": Replaying, "silent": Silent, "vanish": Vanishing,
                                  "cut": Cutting,
                                  "bad_hash": BadHash, "huge": Huge, "trickle": Trickle, "short": Short,
                                  "short_range": ShortRange, "mute": Mute, "overrun": Overrun, "escapes": Escapes,
                                  "nudge_silent": SilentLeaves, "nudge_garbage": GarbageLeaves}

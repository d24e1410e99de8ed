"""The executor side of the remote harness: `python -m remote_executor.server --home H --port P`.

A separate process with its own TRAINMASTER_HOME (H): it runs each attempt with a real LocalBackend in
`H/attempts/<attempt id>/`, behind the untrusted behaviour of tests/untrusted_backend.py (TAO quotes,
commitments signed with a real sr25519 key), and answers the protocol of protocol.py on 127.0.0.1:P.
Everything it needs to find an attempt again is in H (`H/handles/<attempt id>.json`), so a server killed
with `kill -9` and started again on the same home answers for the attempts it ran before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
from pathlib import Path

from aiohttp import web

from remote_executor import protocol
from trainmaster.backends import transfer
from trainmaster.backends.base import AttemptContext, Handle, Offer, OfferRequest
from trainmaster.backends.features import Conclusion
from trainmaster.jobs.checkpoint import MANIFEST, segment_dir, segment_indices
from trainmaster.jobs.files import sha256_file
from trainmaster.jobs.spec import JobSpec
from untrusted_backend import UntrustedExecutor

ATTEMPT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CHUNK = 1 << 16


class ExecutorServer:
    """The routes of protocol.py over one executor home."""

    def __init__(self, home: Path, executor: UntrustedExecutor):
        self.home, self.executor = home, executor
        for sub in ("attempts", "bundles", "handles"):
            (home / sub).mkdir(parents=True, exist_ok=True)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2**20)
        p = protocol
        app.router.add_get(p.HELLO, self.hello)
        app.router.add_post(p.OFFERS, self.offers)
        app.router.add_put(p.BUNDLE, self.bundle)
        app.router.add_post(p.ATTEMPTS, self.submit)
        app.router.add_get(p.STATUS, self.status)
        app.router.add_get(p.LOGS, self.logs)
        app.router.add_get(p.METRICS, self.metrics)
        app.router.add_get(p.CHECKPOINT, self.checkpoint)
        app.router.add_post(p.CANCEL, self.cancel)
        app.router.add_get(p.OUTPUTS, self.outputs)
        app.router.add_get(p.OUTPUT_FILE, self.output_file)
        app.router.add_post(p.COST, self.cost)
        app.router.add_get(p.EXECUTOR, self.identity)
        app.router.add_get(p.COMMITMENT, self.commitment)
        app.router.add_post(p.OPENINGS, self.openings)
        app.router.add_get(p.OPENED_FILE, self.opened_file)
        app.router.add_post(p.CONCLUDE, self.conclude)
        return app

    # offers and starting an attempt

    async def hello(self, request: web.Request) -> web.Response:
        return web.json_response({"protocol": protocol.VERSION, "hotkeys": sorted(self.executor.keypairs)})

    async def offers(self, request: web.Request) -> web.Response:
        asked = OfferRequest.model_validate((await request.json())["request"])
        return _model(await self.executor.offers(asked))

    async def bundle(self, request: web.Request) -> web.Response:
        """The bundle streamed as the body, hashed as it arrives; kept only when its sha256 is the one named."""
        sha256 = request.match_info["sha256"]
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise _refused(web.HTTPBadRequest, "a bundle is named by its sha256")
        target = self.home / "bundles" / f"{sha256}.tar"
        if target.is_file():
            return web.json_response({"sha256": sha256, "size": target.stat().st_size})
        part, digest, size = target.with_suffix(".partial"), hashlib.sha256(), 0
        with open(part, "wb") as sink:
            async for chunk in request.content.iter_chunked(CHUNK):
                digest.update(chunk)
                sink.write(chunk)
                size += len(chunk)
        if digest.hexdigest() != sha256:
            part.unlink()
            raise _refused(web.HTTPUnprocessableEntity, f"the bundle's sha256 is {digest.hexdigest()}, not {sha256}")
        os.replace(part, target)
        return web.json_response({"sha256": sha256, "size": size})

    async def submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        spec, offer = JobSpec.model_validate(body["spec"]), Offer.model_validate(body["offer"])
        ctx = AttemptContext.model_validate(body["context"])
        attempt_id = _attempt_id(ctx.attempt_id)
        bundle = self.home / "bundles" / f"{ctx.bundle_sha256}.tar"
        if not bundle.is_file():
            raise _refused(web.HTTPConflict, f"bundle {ctx.bundle_sha256} was not uploaded")
        ctx = ctx.model_copy(update={"workdir": str(self.home / "attempts" / attempt_id),
                                     "resume_from": self._resume_path(ctx.resume_from)})
        handle = await self.executor.submit(bundle, spec, offer, ctx)
        (self.home / "handles" / f"{attempt_id}.json").write_text(handle.model_dump_json())
        return web.json_response({"attempt_id": attempt_id, "hotkey": handle.data["hotkey"]})

    def _resume_path(self, ref: str | None) -> str | None:
        """The checkpoint folder a reference of ours names (`attempt:<id>`); refused when it names none."""
        if ref is None:
            return None
        if not ref.startswith(protocol.RESUME_SCHEME):
            raise _refused(web.HTTPUnprocessableEntity, f"not a checkpoint reference of this executor: {ref!r}")
        checkpoints = self.home / "attempts" / _attempt_id(ref.removeprefix(protocol.RESUME_SCHEME)) / "checkpoints"
        if not checkpoints.is_dir():
            raise _refused(web.HTTPUnprocessableEntity, f"no checkpoints here for {ref!r}")
        return str(checkpoints)

    # one attempt

    def _handle(self, request: web.Request) -> Handle:
        path = self.home / "handles" / f"{_attempt_id(request.match_info['attempt_id'])}.json"
        if not path.is_file():
            raise _refused(web.HTTPNotFound, "no such attempt here")
        return Handle.model_validate_json(path.read_text())

    def _inner(self, request: web.Request) -> Handle:
        """The attempt's handle as its LocalBackend knows it."""
        handle = self._handle(request)
        return Handle(backend="local", attempt_id=handle.attempt_id, data=handle.data)

    async def status(self, request: web.Request) -> web.Response:
        return _model(await self.executor.status(self._handle(request)))

    async def logs(self, request: web.Request) -> web.Response:
        return _model(await self.executor.logs(self._handle(request), _int(request, "offset")))

    async def metrics(self, request: web.Request) -> web.Response:
        chunk = await self.executor.local.metrics(self._inner(request), _int(request, "offset"),
                                                  min(_int(request, "limit", CHUNK), CHUNK))
        return web.json_response({"data": protocol.encode(chunk.data), "offset": chunk.offset, "size": chunk.size,
                                  "modified_at": chunk.modified_at})

    async def checkpoint(self, request: web.Request) -> web.Response:
        found = await self.executor.local.last_checkpoint(self._inner(request))
        uri = None if found is None else protocol.RESUME_SCHEME + request.match_info["attempt_id"]
        return web.json_response({"uri": uri})

    async def cancel(self, request: web.Request) -> web.Response:
        return web.json_response({"stopped": await self.executor.local.cancel(self._inner(request))})

    async def outputs(self, request: web.Request) -> web.Response:
        files = transfer.list_files(Path(self._handle(request).data["workdir"]) / "outputs")
        return web.json_response({"files": [f.model_dump() for f in files]})

    async def output_file(self, request: web.Request) -> web.StreamResponse:
        return await _stream(request, Path(self._handle(request).data["workdir"]) / "outputs")

    async def cost(self, request: web.Request) -> web.Response:
        offer = Offer.model_validate((await request.json())["offer"])
        return _model(await self.executor.cost(self._handle(request), offer))

    async def identity(self, request: web.Request) -> web.Response:
        return _model(await self.executor.executor(self._handle(request)))

    async def commitment(self, request: web.Request) -> web.Response:
        handle = self._handle(request)
        if not (Path(handle.data["workdir"]) / "outputs" / "commitment.json").is_file():
            raise _refused(web.HTTPConflict, "no commitment: the run has not committed")
        return _model(await self.executor.signed_commitment(handle))

    async def conclude(self, request: web.Request) -> web.Response:
        """The broker's conclusion after the verdict: kept, checked and countersigned by the executor."""
        conclusion = Conclusion.model_validate(await request.json())
        return _model(await self.executor.conclude(self._handle(request), conclusion))

    async def openings(self, request: web.Request) -> web.Response:
        """Every segment's manifest and the full files of each challenged segment and the state after it."""
        source = Path(self._handle(request).data["workdir"]) / "checkpoints"
        indices = [int(i) for i in (await request.json())["indices"]]
        self.executor.opened.append(indices)
        wanted = set(indices) | {i + 1 for i in indices}
        paths = []
        for index in segment_indices(source):
            here = segment_dir(source, index)
            paths += sorted(here.iterdir()) if index in wanted else [here / MANIFEST]
        files = [{"path": p.relative_to(source).as_posix(), "size": p.stat().st_size,
                  "sha256": sha256_file(p)} for p in paths]
        return web.json_response({"files": files})

    async def opened_file(self, request: web.Request) -> web.StreamResponse:
        return await _stream(request, Path(self._handle(request).data["workdir"]) / "checkpoints")


async def _stream(request: web.Request, root: Path) -> web.StreamResponse:
    """The file `path` under `root` from `?offset=` on, as the body."""
    rel = request.match_info["path"]
    path = root / rel
    if not protocol.safe_relative(rel) or not path.is_file() or path.is_symlink():
        raise _refused(web.HTTPNotFound, "no such file")
    response = web.StreamResponse()
    await response.prepare(request)
    with open(path, "rb") as f:
        f.seek(_int(request, "offset"))
        while chunk := f.read(CHUNK):
            await response.write(chunk)
    await response.write_eof()
    return response


def _model(model) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


def _refused(kind: type[web.HTTPException], reason: str) -> web.HTTPException:
    return kind(text=json.dumps({"error": reason}), content_type="application/json")


def _attempt_id(text: str) -> str:
    if not ATTEMPT_ID.fullmatch(text) or text in (".", ".."):
        raise _refused(web.HTTPBadRequest, "not an attempt id")
    return text


def _int(request: web.Request, name: str, default: int = 0) -> int:
    try:
        value = int(request.query.get(name, default))
    except ValueError:
        raise _refused(web.HTTPBadRequest, f"{name} is not an integer") from None
    if value < 0:
        raise _refused(web.HTTPBadRequest, f"{name} is negative")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    os.environ["TRAINMASTER_HOME"] = str(args.home)
    server = ExecutorServer(args.home, UntrustedExecutor())
    web.run_app(server.app(), host="127.0.0.1", port=args.port, print=None, reuse_address=True)


if __name__ == "__main__":
    main()

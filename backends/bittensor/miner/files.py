"""Files the miner hands out and takes in: manifests (path, size, sha256) of an attempt's outputs and of
the segments a challenge opens, downloads that resume with `Range: bytes=N-`, and the bundle upload, hashed
as it streams in and kept only whole and matching its name.

What a job wrote is not trusted: a path is served only when it is a safe relative path
(protocol.safe_relative) whose every part below the attempt's folder is a real folder or, last, a regular
file; a link anywhere on the way (the job could swap `checkpoints/` for a link to the miner's wallet) is
never followed, and the file is opened without following links."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import stat
from pathlib import Path

from aiohttp import web

from trainmaster.backends import transfer
from trainmaster.backends.base import OutputFile
from trainmaster.backends.bittensor import protocol
from trainmaster.backends.segments import segments_dir
from trainmaster.jobs.files import HostileFile, open_regular

CHUNK = 4 << 20
RANGE = re.compile(r"^bytes=(\d{1,19})-$")


class BodyTooLarge(web.HTTPClientError):
    """413 with a body of ours (aiohttp's own HTTPRequestEntityTooLarge writes its own text)."""

    status_code = 413


class TooLarge(Exception):
    """A body past its limit."""


class Mismatch(Exception):
    """A body whose sha256 is not the one it was named by."""


def real_dir(base: Path, *parts: str) -> Path | None:
    """`base/parts...` when each part is a folder and none is a link; None otherwise."""
    path = base
    for part in parts:
        path = path / part
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
    return path


def regular_file(root: Path, rel: str) -> Path | None:
    """`root/rel` when `rel` is safe and names a regular file reached through real folders only."""
    if not protocol.safe_relative(rel):
        return None
    *folders, name = rel.split("/")
    parent = real_dir(root, *folders)
    if parent is None:
        return None
    try:
        return parent / name if stat.S_ISREG(os.lstat(parent / name).st_mode) else None
    except OSError:
        return None


def manifest(root: Path | None) -> list[OutputFile]:
    """Every regular file under `root` (links and special files left out) with its size and sha256."""
    return transfer.list_files(root) if root is not None else []


def challenge_manifest(workdir: Path, indices: list[int]) -> list[OutputFile]:
    """Every segment's manifest and every file of each challenged segment i and of i + 1, named by their
    path under the checkpoint folder (`segments/00000003/manifest.json`)."""
    base = segments_dir(workdir)
    if base is None or real_dir(workdir, "checkpoints", "segments") is None:
        return []
    wanted = set(indices) | {i + 1 for i in indices}
    files = []
    for name in sorted(p.name for p in base.iterdir() if p.name.isascii() and p.name.isdigit()):
        folder = real_dir(base, name)
        if folder is None:
            continue
        prefix = f"segments/{name}/"
        if int(name) in wanted:
            files += [f.model_copy(update={"path": prefix + f.path}) for f in transfer.list_files(folder)]
        elif regular_file(folder, "manifest.json") is not None:
            [found] = [f for f in transfer.list_files(folder) if f.path == "manifest.json"]
            files.append(found.model_copy(update={"path": prefix + found.path}))
    chunks = real_dir(workdir, "checkpoints", "chunks")  # the sampled tier's boundary openings
    if chunks is not None:
        files += [f.model_copy(update={"path": "chunks/" + f.path}) for f in transfer.list_files(chunks)
                  if "/" not in f.path and f.path.endswith(".json")]
    return files


async def send(request: web.Request, path: Path | None) -> web.StreamResponse:
    """The file's bytes: all of it (200), or from byte N on for `Range: bytes=N-` (206 + Content-Range)."""
    if path is None:
        raise refusal(web.HTTPNotFound, "no such file")
    try:
        fd, info = await asyncio.to_thread(open_regular, path)
    except (OSError, HostileFile):
        raise refusal(web.HTTPNotFound, "no such file") from None
    with os.fdopen(fd, "rb") as f:
        size, start = info.st_size, 0
        asked = request.headers.get("Range")
        response = web.StreamResponse()
        if asked is not None:
            found = RANGE.fullmatch(asked.strip())
            if not found or int(found[1]) >= size:
                raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"},
                                                         text='{"error": "unsatisfiable range"}',
                                                         content_type="application/json")
            start = int(found[1])
            response.set_status(206)
            response.headers["Content-Range"] = f"bytes {start}-{size - 1}/{size}"
        response.content_length = size - start
        response.content_type = "application/octet-stream"
        await response.prepare(request)
        f.seek(start)
        left = size - start
        while left > 0 and (chunk := await asyncio.to_thread(f.read, min(CHUNK, left))):
            await response.write(chunk)
            left -= len(chunk)
    await response.write_eof()
    return response


async def receive_bundle(request: web.Request, target: Path, sha256: str, limit: int) -> int:
    """Stream the body into `target` (named by its sha256), hashing as it arrives; the size. TooLarge past
    `limit` bytes, Mismatch for another sha256: nothing is kept then."""
    part = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    digest, size, pending = hashlib.sha256(), 0, []
    try:
        with open(part, "wb") as sink:
            async for chunk in request.content.iter_chunked(1 << 16):
                size += len(chunk)
                if size > limit:
                    raise TooLarge()
                digest.update(chunk)
                pending.append(chunk)
                if sum(map(len, pending)) >= CHUNK:
                    await asyncio.to_thread(sink.write, b"".join(pending))
                    pending = []
            await asyncio.to_thread(_finish, sink, b"".join(pending))
        if digest.hexdigest() != sha256:
            raise Mismatch(digest.hexdigest())
        os.replace(part, target)
        return size
    finally:
        part.unlink(missing_ok=True)


def _finish(sink, data: bytes) -> None:
    sink.write(data)
    sink.flush()
    os.fsync(sink.fileno())


def refusal(kind: type[web.HTTPException], reason: str) -> web.HTTPException:
    """A refusal as the protocol has it: {"error": reason} with the status of `kind`."""
    return kind(text=json.dumps({"error": reason}), content_type="application/json")

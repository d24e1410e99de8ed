"""How a verification in the audit pool has the executor open its challenged segments: by asking the broker.

The challenged segments are drawn inside the verification (after the commitment is stored), but only the broker's
event loop can talk to the executor. So while a verification runs, the broker serves a unix socket in a private
temporary folder (`serving`); the worker process is given `AskBroker` (picklable: the socket's path and a token)
as the pipeline's `open_segments`, sends the indices as one JSON line, and gets back the folder the openings were
written to, or the reason they were not (a `VerificationError`'s kind and reason, raised again in the worker).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmaster.verify.errors import VerificationError

if TYPE_CHECKING:
    from trainmaster.verify.openings import Openings

Opener = Callable[[list[int]], Awaitable[Path]]
"""Opens the challenged segments (their indices) and returns the folder holding them; raises VerificationError."""
MAX_REQUEST_BYTES = 1 << 20


@dataclass(frozen=True)
class AskBroker:
    """The worker side: `open_segments` for the pipeline, answered by the broker that serves `socket_path`."""

    socket_path: str
    token: str

    def __call__(self, indices: list[int]) -> Openings:
        from trainmaster.verify.openings import LocalOpenings

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(self.socket_path)
            sock.sendall(json.dumps({"token": self.token, "segments": list(indices)}).encode() + b"\n")
            line = sock.makefile("rb").readline()
        if not line:
            raise VerificationError(f"the broker stopped before the challenged segments {indices} were opened",
                                    kind="cannot_verify")
        reply = json.loads(line)
        if "directory" in reply:
            return LocalOpenings(Path(reply["directory"]))
        if "refused" in reply:
            raise VerificationError(reply["refused"]["reason"], kind=reply["refused"]["kind"])
        raise RuntimeError(reply["failed"])


@asynccontextmanager
async def serving(opener: Opener) -> AsyncIterator[AskBroker]:
    """Serve `opener` on this event loop for as long as the block runs; yields what the worker is given."""
    folder = Path(tempfile.mkdtemp(prefix="tm-open-"))  # 0700: only we can connect
    token = secrets.token_hex(16)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            reply = await _reply(await reader.readline(), token, opener)
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        finally:
            writer.close()

    path = str(folder / "openings.sock")
    server = await asyncio.start_unix_server(answer, path, limit=MAX_REQUEST_BYTES)
    try:
        yield AskBroker(path, token)
    finally:
        server.close()
        await server.wait_closed()
        shutil.rmtree(folder, ignore_errors=True)


async def _reply(line: bytes, token: str, opener: Opener) -> dict[str, Any]:
    """The answer to one request: the folder of the openings, a refusal (VerificationError), or a failure."""
    try:
        request = json.loads(line)
        if not hmac.compare_digest(str(request["token"]), token):
            return {"failed": "the request to open segments carried a wrong token"}
        indices = [int(i) for i in request["segments"]]
    except (ValueError, KeyError, TypeError) as exc:
        return {"failed": f"an unreadable request to open segments: {type(exc).__name__}: {exc}"}
    try:
        return {"directory": str(await opener(indices))}
    except VerificationError as exc:
        return {"refused": {"kind": exc.kind, "reason": exc.reason}}
    except Exception as exc:  # noqa: BLE001 — told to the pipeline, which makes it "cannot verify"
        return {"failed": f"{type(exc).__name__}: {exc}"}

"""The CLI's side of a running daemon: find it (its state file, then a cheap health check) and call its API.

Over aiohttp, the project's one HTTP client library (docs/architecture.md, "One HTTP client library"): a
session per call on a loop of its own (the commands that talk to a daemon are synchronous), over TCP or the
daemon's unix socket. aiohttp and asyncio are imported inside the call, so a command that never talks to a
daemon never imports them; the read-only commands answer from the store the daemon keeps and send no request.
Every call has a timeout; a daemon that does not answer is `Unreachable` (an OSError: the command says
so and exits 2). An error the API answers is reported as the command's own would be: 400 exits 1 (the
thing asked about is bad), anything else 2.
"""

from __future__ import annotations

import json

from trainmaster.broker.cli.exits import BAD, USAGE, fail

HEALTH_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 300.0
CONNECT_TIMEOUT_S = 5.0
MAX_ANSWER_BYTES = 64 << 20
"""An answer larger than this is not the daemon's (its largest, a log chunk, is far smaller)."""


class Unreachable(OSError):
    """The daemon did not answer: refused, dropped, timed out, or not HTTP; the message says which."""


class Daemon:
    """A daemon's API at `address` (`http://127.0.0.1:PORT` or `unix:PATH`), called with `token`."""

    def __init__(self, address: str, token: str):
        self.address, self.token = address, token

    def call(self, method: str, path: str, body: dict | None = None, *, timeout: float = CALL_TIMEOUT_S):
        """The decoded JSON answer; an error answer ends the command with its message and exit code."""
        status, answer = self.raw(method, path, body, timeout=timeout)
        if status >= 400:
            fail(f"the daemon says: {answer.get('error', answer) if isinstance(answer, dict) else answer}",
                 BAD if status == 400 else USAGE)
        return answer

    def raw(self, method: str, path: str, body: dict | None = None, *, timeout: float = CALL_TIMEOUT_S):
        """(status, decoded JSON) without judging the status; Unreachable when the daemon does not answer."""
        import asyncio

        return asyncio.run(self._request(method, path, body, timeout))

    async def _request(self, method: str, path: str, body: dict | None, timeout: float):
        import asyncio

        import aiohttp

        headers = {"Authorization": f"Bearer {self.token}"}
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.address.startswith("unix:"):
            connector, base = aiohttp.UnixConnector(path=self.address[len("unix:"):]), "http://localhost"
        else:
            connector, base = aiohttp.TCPConnector(), self.address.rstrip("/")
        limits = aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, CONNECT_TIMEOUT_S))
        where = f"the daemon at {self.address}"
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=limits) as session:
                async with session.request(method, base + path, data=data, headers=headers) as response:
                    raw = bytearray()
                    async for chunk in response.content.iter_chunked(1 << 16):
                        raw += chunk
                        if len(raw) > MAX_ANSWER_BYTES:
                            raise Unreachable(f"{where} sent an answer over {MAX_ANSWER_BYTES >> 20} MiB to "
                                              f"{method} {path}")
                    status = response.status
        except Unreachable:
            raise
        except asyncio.TimeoutError:
            raise Unreachable(f"{where} did not answer {method} {path} within {timeout:g} s") from None
        except (aiohttp.ClientError, OSError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise Unreachable(f"{where} did not answer {method} {path}: {why}") from None
        try:
            return status, json.loads(bytes(raw) or b"null")
        except ValueError:
            raise Unreachable(f"{where} answered {method} {path} with something that is not JSON "
                              f"(HTTP {status})") from None

    def answers(self) -> bool:
        """Whether a server answers at the address at all (a refused token is an answer: the daemon is there)."""
        try:
            self.raw("GET", "/v1/health", timeout=HEALTH_TIMEOUT_S)
        except Unreachable:
            return False
        return True

    def health(self) -> dict | None:
        """The daemon's /v1/health, or None when it does not answer (in time, or at all)."""
        try:
            status, answer = self.raw("GET", "/v1/health", timeout=HEALTH_TIMEOUT_S)
        except Unreachable:
            return None
        return answer if status == 200 else None


def running() -> Daemon | None:
    """The running daemon of this home, when its state file names a live process that answers; else None.
    A daemon that refuses our token is still the daemon: the command's request then says why."""
    from trainmaster.broker.daemon import state_file, token

    found = state_file.read()
    if found is None:
        return None
    try:
        daemon = Daemon(found.address, token.read_token())
    except OSError:
        return None
    return daemon if daemon.answers() else None

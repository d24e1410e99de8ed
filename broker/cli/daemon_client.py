"""The CLI's side of a running daemon: find it (its state file, then a cheap health check) and call its API.

Plain `http.client` (TCP, or a unix socket), so a command that talks to the daemon imports neither
aiohttp nor asyncio. An error the API answers is reported as the command's own would be: 400 exits 1
(the thing asked about is bad), anything else 2.
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse

from trainmaster.broker.cli.exits import BAD, USAGE, fail

HEALTH_TIMEOUT_S = 2.0
CALL_TIMEOUT_S = 300.0


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Daemon:
    """A daemon's API at `address` (`http://127.0.0.1:PORT` or `unix:PATH`), called with `token`."""

    def __init__(self, address: str, token: str):
        self.address, self.token = address, token

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.address.startswith("unix:"):
            return _UnixConnection(self.address[len("unix:"):], timeout)
        url = urllib.parse.urlsplit(self.address)
        return http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)

    def call(self, method: str, path: str, body: dict | None = None, *, timeout: float = CALL_TIMEOUT_S):
        """The decoded JSON answer; an error answer ends the command with its message and exit code."""
        status, answer = self.raw(method, path, body, timeout=timeout)
        if status >= 400:
            fail(f"the daemon says: {answer.get('error', answer) if isinstance(answer, dict) else answer}",
                 BAD if status == 400 else USAGE)
        return answer

    def raw(self, method: str, path: str, body: dict | None = None, *, timeout: float = CALL_TIMEOUT_S):
        """(status, decoded JSON) without judging the status."""
        connection = self._connection(timeout)
        try:
            headers = {"Authorization": f"Bearer {self.token}"}
            data = None if body is None else json.dumps(body).encode()
            if data is not None:
                headers["Content-Type"] = "application/json"
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            return response.status, json.loads(response.read() or b"null")
        finally:
            connection.close()

    def answers(self) -> bool:
        """Whether a server answers at the address at all (a refused token is an answer: the daemon is there)."""
        try:
            self.raw("GET", "/v1/health", timeout=HEALTH_TIMEOUT_S)
        except (OSError, ValueError, http.client.HTTPException):
            return False
        return True

    def health(self) -> dict | None:
        """The daemon's /v1/health, or None when it does not answer (in time, or at all)."""
        try:
            status, answer = self.raw("GET", "/v1/health", timeout=HEALTH_TIMEOUT_S)
        except (OSError, ValueError, http.client.HTTPException):
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

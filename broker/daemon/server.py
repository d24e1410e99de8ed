"""The daemon's HTTP server, with a server's manners: bounded connections, timeouts, errors that echo nothing.

- **Timeouts.** A connection must complete a request's headers within `IDLE_TIMEOUT_S` of opening or of its last
  answer (aiohttp's keep-alive timer, which runs from the connection's start, so a client that drips its headers a
  byte at a time is closed too); a body must arrive within `api.BODY_TIMEOUT_S`.
- **A connection limit below the file limit.** At start the soft `RLIMIT_NOFILE` is raised to the hard one where
  allowed (`raise_file_limit`); the daemon then takes at most that many connections less `RESERVED_FDS` (the
  database, the logs, the jobs' files and pipes need descriptors too) and room for the connections accepted in a
  burst before the limit sees them (`connection_limit`), and never more than `--max-connections`. At
  the limit a new connection closes the idlest one (the oldest that has no request being answered), as web
  servers drop idle keep-alive connections; only when every connection is busy is the new one answered 503 and
  closed. So idle connections can neither exhaust the descriptors (no `EMFILE` storm) nor keep `/v1/health` out.
- **Errors that echo nothing.** A request aiohttp cannot parse (a 16 KB header, a bad request line) is answered 400
  with a fixed message naming the kind of problem, never the bytes sent, and logged as one line at debug level.

`GuardedSite` serves a bound socket (TCP or unix) through `Guard`, the protocol factory that applies the limit;
`Busy` is the middleware that marks which connections have a request being answered.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
from collections.abc import Iterable

from aiohttp import http_exceptions, web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("trainmaster.daemon")

IDLE_TIMEOUT_S = 15.0
"""A connection that has not completed a request's headers this long after opening, or after its last answer, is
closed."""
RESERVED_FDS = 256
"""File descriptors kept for everything but client connections."""
MAX_CONNECTIONS = 1024
"""The default `--max-connections`."""
MAX_LINE = 8190
"""The longest request line or header taken (aiohttp's default)."""


def raise_file_limit() -> int:
    """Raise the soft limit on open files to the hard one where allowed; the soft limit then in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


BACKLOG = 128
"""The listening socket's backlog: asyncio accepts up to this many connections at a time, each a descriptor, before
any of them reaches the limit's check."""


def connection_limit(file_limit: int, wanted: int = MAX_CONNECTIONS) -> int:
    """How many client connections to take under a file limit: `wanted`, less when the limit leaves less. Room is
    kept for `RESERVED_FDS` and for three accept bursts (`BACKLOG` each) beyond the limit: connections accepted
    before the limit closes the idle ones they displace (under 1,024 files: 384 connections)."""
    return max(8, min(wanted, file_limit - RESERVED_FDS - 3 * BACKLOG))


def handler_args() -> dict:
    """The aiohttp request handlers' settings (timeouts, line sizes); the same for every connection."""
    return {"keepalive_timeout": IDLE_TIMEOUT_S, "max_line_size": MAX_LINE, "max_field_size": MAX_LINE,
            "max_headers": 64, "lingering_time": 2.0, "access_log": None}


_PARSE_ERRORS = (
    (http_exceptions.LineTooLong, f"a request line or header is too long (at most {MAX_LINE} bytes)"),
    (http_exceptions.BadHttpMethod, "not an HTTP request"),
    (http_exceptions.BadStatusLine, "a malformed request line"),
    (http_exceptions.InvalidHeader, "a malformed header"),
)


class QuietHandler(RequestHandler):
    """aiohttp's request handler, whose answer to a request it cannot parse names the problem but never repeats
    what was sent (aiohttp's own puts the offending line in the body and logs a traceback per request)."""

    __slots__ = ()

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        reason = next((text for kind, text in _PARSE_ERRORS if isinstance(exc, kind)), "a malformed request")
        if status >= 500:
            reason = "an internal error"
            log.error("the server failed on a request: %s", type(exc).__name__ if exc else "unknown")
        else:
            log.debug("refused a request: %s (%s)", reason, type(exc).__name__ if exc else "")
        response = web.Response(status=status, text=json.dumps({"error": f"bad request: {reason}"
                                                                if status < 500 else reason}),
                                content_type="application/json")
        response.force_close()
        return response


class _Refused(asyncio.Protocol):
    """A connection over the limit while every other one is busy: a 503 and closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = b'{"error": "too many connections; try again"}'
        transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                        + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        transport.close()


class Guard:
    """The protocol factory: a QuietHandler per connection, at most `limit` of them open (see the module's doc)."""

    def __init__(self, server: web.Server, limit: int, busy: set):
        self.server, self.limit, self.busy = server, limit, busy
        self.evicted = self.refused = 0

    def __call__(self) -> asyncio.BaseProtocol:
        open_now = self.server.connections
        if len(open_now) >= self.limit and not self._evict(open_now, len(open_now) - self.limit + 1):
            self.refused += 1
            return _Refused()
        return QuietHandler(self.server, loop=asyncio.get_running_loop(), **handler_args())

    def _evict(self, handlers: Iterable[RequestHandler], count: int) -> bool:
        """Close the `count` oldest connections with no request being answered; whether there were as many."""
        idle = [h for h in handlers if h not in self.busy][:count]
        for handler in idle:
            handler.force_close()
        self.evicted += len(idle)
        return len(idle) == count


class GuardedSite(web.SockSite):
    """A site on a bound socket whose connections are made by a `Guard`."""

    __slots__ = ("guard",)

    def __init__(self, runner: web.AppRunner, sock: socket.socket, guard: Guard):
        super().__init__(runner, sock, backlog=BACKLOG)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        self._server = await asyncio.get_running_loop().create_server(self.guard, sock=self._sock,
                                                                      backlog=self._backlog)


def busy_middleware(busy: set):
    """A middleware that keeps, in `busy`, the connections whose request is being answered now."""

    @web.middleware
    async def mark_busy(request: web.Request, handler):
        protocol = request.protocol
        busy.add(protocol)
        try:
            return await handler(request)
        finally:
            busy.discard(protocol)

    return mark_busy

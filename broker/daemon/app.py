"""The daemon's aiohttp application: the API's routes behind the token check and the error mapping.

`make_app(ctx)` is the one place routes are added: the API's, and Prometheus `/metrics` and the dashboard
(broker/daemon/web/), behind the same middleware.
"""

from __future__ import annotations

import logging

from aiohttp import web

from trainmaster.broker.daemon import api, token
from trainmaster.broker.daemon.context import CTX, DaemonContext

log = logging.getLogger("trainmaster.daemon")

MAX_BODY = 1024 * 1024
"""The largest request body taken (413 above)."""


def _given_token(request: web.Request) -> str | None:
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer":  # auth schemes are case-insensitive (RFC 9110 §11.1)
        return credentials.strip()
    if request.method == "GET" and request.path == "/dashboard" and "token" in request.query:
        return request.query["token"]  # a browser signing in: answered with the cookie and a redirect (web/dashboard.py)
    return request.cookies.get(token.COOKIE)


@web.middleware
async def authenticated(request: web.Request, handler):
    """Every request carries the token (a Bearer header or the cookie); 401 otherwise."""
    if not token.matches(_given_token(request), request.app[CTX].token_digest):
        return web.json_response({"error": "a valid token is required (Authorization: Bearer <token>, "
                                           "kept in <home>/daemon/token)"}, status=401,
                                 headers={"WWW-Authenticate": "Bearer"})
    return await handler(request)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """Our exceptions answered as `{"error": message}` with their status (api.ERRORS); others are a 500."""
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 — every failure gets an answer, the daemon keeps running
        code = api.error_status(exc)
        if code is None:
            log.exception("the API failed on %s %s", request.method, request.path)
            return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=500)
        message = str(exc.args[0]) if code == 404 and exc.args else str(exc)
        return web.json_response({"error": message}, status=code)


def make_app(ctx: DaemonContext, busy: set | None = None) -> web.Application:
    """The application; `busy` (broker/daemon/server.py) collects the connections whose request is being
    answered, so the connection limit closes idle ones only."""
    from trainmaster.broker import paths
    from trainmaster.broker.daemon.server import busy_middleware
    from trainmaster.broker.daemon.web import add_routes

    first = [busy_middleware(busy)] if busy is not None else []
    app = web.Application(middlewares=[*first, authenticated, errors_as_json], client_max_size=MAX_BODY)
    app[CTX] = ctx
    app.add_routes(api.routes)
    add_routes(app, paths.state_db(), budgets=ctx.budgets, lag_source=ctx.trigger_lags)  # /metrics, /dashboard
    return app

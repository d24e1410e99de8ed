"""The dashboard's handlers: the page (a Jinja2 template, escaped throughout) and its JSON.

`GET /dashboard?token=…` is how a browser signs in: the answer sets the `trainmaster_token` cookie
(HttpOnly, SameSite=Strict) and redirects to `/dashboard`, so the token leaves the address bar and
the history. Every page carries a Content-Security-Policy that lets only its own inline script run
(a nonce per answer), so even a name that slipped past escaping could not run a script.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from trainmaster.broker.daemon.web import page, readings
from trainmaster.broker.daemon.web.metrics import BudgetSource

COOKIE = "trainmaster_token"
POLL_MS = 2000
"""How often the page asks for the jobs' states."""
TEMPLATES = Path(__file__).with_name("templates")


class Views:
    def __init__(self, store_path: Path, budgets: BudgetSource):
        self.store_path, self.budgets = store_path, budgets
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined)
        self.templates.filters["when"] = _when
        self.templates.filters["pretty"] = _pretty

    async def page(self, request: web.Request) -> web.Response:
        if "token" in request.query:
            raise _sign_in(request.query["token"])
        built = await self._read(page.build, self.store_path, list(self.budgets()), None, _page_number(request))
        nonce = secrets.token_urlsafe(16)
        html = self.templates.get_template("dashboard.html").render(page=built, nonce=nonce, poll_ms=POLL_MS)
        return web.Response(text=html, content_type="text/html", headers=_page_headers(nonce))

    async def jobs(self, request: web.Request) -> web.Response:
        """The jobs' rows: the newest MOST_JOBS, or with `?page=N` that page of the table (and its paging)."""
        if "page" not in request.query:
            return _json({"jobs": await self._read(page.job_rows, self.store_path)})
        paged = await self._read(page.paging, self.store_path, _page_number(request))
        rows = await self._read(page.job_rows, self.store_path, paged.per_page, paged.page)
        return _json({"jobs": rows, "paging": dataclasses.asdict(paged)})

    async def job_metrics(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        series = await self._read(page.job_curves, self.store_path, job_id)
        if series is None:
            raise web.HTTPNotFound(text=f"no job {job_id!r}")
        return _json({"job_id": job_id, "series": series})

    async def spend(self, request: web.Request) -> web.Response:
        return _json(await self._read(page.spend, self.store_path, list(self.budgets())))

    async def verdicts(self, request: web.Request) -> web.Response:
        return _json({"verdicts": await self._read(page.verdict_rows, self.store_path)})

    @staticmethod
    async def _read(read: Callable[..., Any], *args: Any) -> Any:
        """`read(*args)` in a thread; 503 while the state database cannot be read."""
        try:
            return await asyncio.to_thread(read, *args)
        except readings.StateMissing as exc:
            raise web.HTTPServiceUnavailable(text=str(exc)) from None


def _page_number(request: web.Request) -> int:
    """The jobs' table page asked for (`?page=N`, from 1; anything else is the first)."""
    asked = request.query.get("page", "1")
    return int(asked) if asked.isdigit() and 0 < int(asked) < 10**6 else 1


def _sign_in(token: str) -> web.HTTPSeeOther:
    """The redirect that keeps the token in an HttpOnly cookie instead of the address."""
    answer = web.HTTPSeeOther("/dashboard", headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
    answer.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
    return answer


def _page_headers(nonce: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline';"
                                    " connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none';"
                                    " frame-ancestors 'none'"),
        "Cache-Control": "no-store",
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
    }


def _json(body: dict) -> web.Response:
    return web.json_response(body, dumps=_dumps, headers={"Cache-Control": "no-store"})


def _dumps(body: Any) -> str:
    return json.dumps(body, default=lambda o: dataclasses.asdict(o) if dataclasses.is_dataclass(o) else str(o))


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")

"""The daemon's HTTP API: the CLI's job operations (submit, list, status, logs, cancel, resume), the triggers (list,
fire one now) and health.

Handlers answer from the state the reconciler keeps up to date; they never run a reconcile pass. The
Broker they use is the API's own (its own database connection), apart from the reconciler's workers; it runs
on a loop of its own (`DaemonContext.on_api_broker`), so a slow database call holds up neither `/v1/health`
nor the dashboard, nor anything else on the daemon's main loop.
Errors come back as `{"error": message}` with a status the CLI maps to its exit codes: 400 the thing
asked about is bad (exit 1), 404 no such job or file, 409 not applicable now, 503 an environment or
backend problem (exit 2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

from aiohttp import web

from trainmaster.backends.base import Handle
from trainmaster.backends.retry import retried
from trainmaster.broker import states
from trainmaster.broker.daemon import query
from trainmaster.broker.daemon.context import CTX, DaemonContext

# Our exceptions, by (module, class), and the HTTP status each is answered with.
ERRORS = (
    ("trainmaster.jobs.yamlfile", "FileError", 400),
    ("trainmaster.broker.planning.planner", "PlanError", 400),
    ("trainmaster.jobs.bundle", "BundleError", 400),
    ("trainmaster.broker.store", "NotFound", 404),
    ("trainmaster.broker.stages.job_context", "NothingToDo", 409),
    ("trainmaster.broker.daemon.triggers.engine", "TriggerRefused", 409),
    ("trainmaster.broker.store", "StateUnavailable", 503),
    ("trainmaster.backends.base", "BackendError", 503),
    ("builtins", "OSError", 503),
    ("sqlite3", "Error", 503),  # the state database (statedb's errors, whatever the database): away, or busy
)

BODY_TIMEOUT_S = 30.0
"""How long a request's body may take to arrive (the headers' time is the server's keep-alive timeout)."""
MAX_LIST = 1000
"""The most jobs one listing returns (`limit=0` asks for this many)."""

routes = web.RouteTableDef()


def _ctx(request: web.Request) -> DaemonContext:
    return request.app[CTX]


def _job_json(broker, job, *, events: bool = False) -> dict:
    from trainmaster.broker.job_view import job_json

    return job_json(broker.store, job, events=events)


async def _body(request: web.Request, allowed: set[str]) -> dict:
    """The JSON object of the request; unknown fields are refused (a typo never goes unnoticed)."""
    try:  # (asyncio.wait_for and its TimeoutError: Python 3.10 has no asyncio.timeout)
        body = await asyncio.wait_for(request.json(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(text=f'{{"error": "the body did not arrive within {BODY_TIMEOUT_S:.0f} s"}}',
                                     content_type="application/json") from None
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "the body is not JSON"}', content_type="application/json")
    if not isinstance(body, dict) or set(body) - allowed:
        unknown = sorted(set(body) - allowed) if isinstance(body, dict) else "not an object"
        raise web.HTTPBadRequest(text=f'{{"error": "unknown fields: {unknown}"}}', content_type="application/json")
    return body


@routes.get("/v1/health")
async def health(request: web.Request) -> web.Response:
    """Always answered, from memory: `status` is `ok`, or `degraded` with the reasons (the database away, a
    configuration file that no longer parses)."""
    ctx = _ctx(request)
    problems = ctx.problems()
    return web.json_response({"pid": os.getpid(), "address": ctx.address,
                              "uptime_s": round(time.time() - ctx.started_at, 3),
                              "in_flight": ctx.reconciler.in_flight(), "passes": ctx.passes,
                              "status": "degraded" if problems else "ok", "problems": problems,
                              "connections": ctx.connections()})


@routes.post("/v1/jobs")
async def submit(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    body = await _body(request, {"spec", "policy"})
    if not isinstance(body.get("spec"), str):
        raise query.bad_request("spec: a path is required")
    if body.get("policy") is not None and not isinstance(body["policy"], str):
        raise query.bad_request("policy: a name or an absolute path is required")
    policy = body.get("policy") or "default"
    spec = ctx.roots.checked("spec", body["spec"])

    if "/" in policy or policy.endswith((".yaml", ".yml")) or "\0" in policy:  # a file: absolute, under a root
        ctx.roots.checked("policy", policy)  # (a bare word is a name: the daemon runs in /, never looks there)

    async def submitted(broker) -> dict:
        ctx.roots.check_spec(spec)
        return _job_json(broker, await broker.submit(spec, policy))

    return web.json_response(await ctx.on_api_broker(submitted), status=201)


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    wanted = None if query.flag(request, "all") else set(states.JOB_TRANSITIONS) - states.JOB_ENDS
    limit = query.integer(request, "limit", 50, low=0, high=MAX_LIST) or MAX_LIST

    async def listed(broker) -> list[dict]:
        return [_job_json(broker, job) for job in broker.store.jobs(states_in=wanted, limit=limit)]

    return web.json_response(await ctx.on_api_broker(listed))


@routes.get("/v1/jobs/{ref}")
async def status(request: web.Request) -> web.Response:
    ref = request.match_info["ref"]

    async def found(broker) -> dict:
        return _job_json(broker, broker.store.find_job(ref), events=True)

    return web.json_response(await _ctx(request).on_api_broker(found))


@routes.get("/v1/jobs/{ref}/logs")
async def logs(request: web.Request) -> web.Response:
    """A chunk of the latest attempt's log from `offset`; `attempt` says whose, so a reader that sees it
    change starts again from 0."""
    ref = request.match_info["ref"]
    wanted_offset = query.integer(request, "offset", 0, low=0, high=query.MAX_OFFSET)
    wanted_attempt = query.text(request, "attempt")

    async def chunk_of(broker) -> dict:
        job = broker.store.find_job(ref)
        started = [a for a in broker.store.attempts(job.id) if a.handle_json]
        if not started:
            return {"attempt": None, "text": "", "next_offset": 0, "complete": False, "state": job.state}
        last = started[-1]
        offset = wanted_offset if wanted_attempt == last.id else 0
        backend = broker.backend(last.backend, broker.policy(job))
        chunk = await retried(backend.logs, Handle.model_validate_json(last.handle_json), offset)
        from trainmaster.broker.executor_text import attempt_log

        return {"attempt": last.id, "text": attempt_log(last.offer_json, chunk.text), "next_offset": chunk.next_offset,
                "complete": chunk.complete, "state": broker.store.job(job.id).state}

    return web.json_response(await _ctx(request).on_api_broker(chunk_of))


@routes.post("/v1/jobs/{ref}/cancel")
async def cancel(request: web.Request) -> web.Response:
    ref = request.match_info["ref"]

    async def cancelled(broker) -> dict:
        return _job_json(broker, await broker.cancel(broker.store.find_job(ref).id), events=True)

    return web.json_response(await _ctx(request).on_api_broker(cancelled))


@routes.post("/v1/jobs/{ref}/resume")
async def resume(request: web.Request) -> web.Response:
    body = await _body(request, {"max_hours", "max_usd"})
    hours, usd = body.get("max_hours"), body.get("max_usd")
    if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float)) or not hours > 0):
        raise query.bad_request("max_hours: a number of hours above 0 is required")
    if usd is not None and (isinstance(usd, bool) or not isinstance(usd, (str, int, float))):
        raise query.bad_request('max_usd: an amount in dollars is required (as text, e.g. "12.50")')
    ref = request.match_info["ref"]

    async def resumed(broker) -> dict:
        job = broker.store.find_job(ref)
        point = await broker.resume_point(job)
        job = await broker.resume(job.id, max_hours=body.get("max_hours"), max_usd=body.get("max_usd"))
        return {**_job_json(broker, job), "resumes_from": point.to_json(), "resume_point": dataclasses.asdict(point)}

    return web.json_response(await _ctx(request).on_api_broker(resumed))


@routes.get("/v1/triggers")
async def list_triggers(request: web.Request) -> web.Response:
    engine = _ctx(request).triggers
    names = sorted(engine.triggers) if engine is not None else []
    return web.json_response({"triggers": [{"name": n, "problem": engine.problems.get(n)} for n in names]})


@routes.post("/v1/triggers/{name}/fire")
async def fire_trigger(request: web.Request) -> web.Response:
    """Fire a trigger now (debounce and the one-run-at-a-time rule still hold); 409 when it cannot."""
    engine = _ctx(request).triggers
    if engine is None:
        raise web.HTTPNotFound(text='{"error": "no triggers: triggers.yaml names none"}', content_type="application/json")
    fired = await engine.fire(request.match_info["name"])
    return web.json_response({"trigger": fired.trigger, "job": fired.job_id, "reason": fired.reason,
                              "error": fired.error})


@routes.post("/v1/reload")
async def reload(request: web.Request) -> web.Response:
    """Read the configuration files again now (as SIGHUP does): validated first, a bad set leaves the old one in
    force and is reported (`problems`)."""
    ctx = _ctx(request)
    if ctx.reload is None:
        raise web.HTTPConflict(text='{"error": "this daemon cannot reload"}', content_type="application/json")
    reloaded = await ctx.reload()
    return web.json_response({"reloaded": reloaded, "problems": list(ctx.config.problems)})


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    from trainmaster.broker.daemon.openapi import DESCRIPTION

    return web.json_response(DESCRIPTION)


def error_status(exc: Exception) -> int | None:
    """The HTTP status our exception `exc` is answered with; None for an unexpected one (a 500)."""
    import sys

    for module, name, code in ERRORS:
        loaded = sys.modules.get(module)
        if loaded is not None and isinstance(exc, getattr(loaded, name)):
            return code
    return None

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

import dataclasses
import os
import time
from pathlib import Path

from aiohttp import web

from trainmaster.backends.base import Handle
from trainmaster.backends.retry import retried
from trainmaster.broker import states
from trainmaster.broker.daemon.context import CTX, DaemonContext

# Our exceptions, by (module, class), and the HTTP status each is answered with.
ERRORS = (
    ("trainmaster.jobs.yamlfile", "FileError", 400),
    ("trainmaster.broker.planner", "PlanError", 400),
    ("trainmaster.jobs.bundle", "BundleError", 400),
    ("trainmaster.broker.store", "NotFound", 404),
    ("trainmaster.broker.service", "NothingToDo", 409),
    ("trainmaster.broker.daemon.triggers.engine", "TriggerRefused", 409),
    ("trainmaster.broker.store", "StateUnavailable", 503),
    ("trainmaster.backends.base", "BackendError", 503),
    ("builtins", "OSError", 503),
)

routes = web.RouteTableDef()


def _ctx(request: web.Request) -> DaemonContext:
    return request.app[CTX]


def _job_json(broker, job, *, events: bool = False) -> dict:
    from trainmaster.broker.cli.render import job_json

    return job_json(broker, job, events=events)


async def _body(request: web.Request, allowed: set[str]) -> dict:
    """The JSON object of the request; unknown fields are refused (a typo never goes unnoticed)."""
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "the body is not JSON"}', content_type="application/json")
    if not isinstance(body, dict) or set(body) - allowed:
        unknown = sorted(set(body) - allowed) if isinstance(body, dict) else "not an object"
        raise web.HTTPBadRequest(text=f'{{"error": "unknown fields: {unknown}"}}', content_type="application/json")
    return body


@routes.get("/v1/health")
async def health(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    return web.json_response({"pid": os.getpid(), "address": ctx.address,
                              "uptime_s": round(time.time() - ctx.started_at, 3),
                              "in_flight": ctx.reconciler.in_flight(), "passes": ctx.passes})


@routes.post("/v1/jobs")
async def submit(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    body = await _body(request, {"spec", "policy"})
    if not isinstance(body.get("spec"), str):
        raise web.HTTPBadRequest(text='{"error": "spec: a path is required"}', content_type="application/json")

    async def submitted(broker) -> dict:
        return _job_json(broker, await broker.submit(Path(body["spec"]), str(body.get("policy") or "default")))

    return web.json_response(await ctx.on_api_broker(submitted), status=201)


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    ctx = _ctx(request)
    wanted = None if request.query.get("all") == "1" else set(states.JOB_TRANSITIONS) - states.JOB_ENDS
    limit = int(request.query.get("limit", "50")) or -1

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
    ref, query = request.match_info["ref"], request.query

    async def chunk_of(broker) -> dict:
        job = broker.store.find_job(ref)
        started = [a for a in broker.store.attempts(job.id) if a.handle_json]
        if not started:
            return {"attempt": None, "text": "", "next_offset": 0, "complete": False, "state": job.state}
        last = started[-1]
        offset = int(query.get("offset", "0")) if query.get("attempt") == last.id else 0
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

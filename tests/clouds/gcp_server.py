"""Google Cloud on 127.0.0.1 for the tests: FakeVertex (Vertex AI's REST API over the real aiplatform_v1 protos,
strict) and gcp-storage-emulator in-process, started once per session, reset per test.

Every request is checked against the services' own rules first (clouds/rules_vertex.py: the CustomJob read back
strictly through the aiplatform_v1 protos, the API's documented limits, Cloud Storage's naming rules); one the
real service would refuse is refused (400 INVALID_ARGUMENT) and recorded (clouds/checked.py).

FakeVertex never advances a job by itself: the test or the runner (gcp_runner.py) sets its state. It also
serves the OAuth token endpoint the test's credentials file names, and answers every API call without that
token with 401, so the whole credentials chain is exercised. `fail_next` makes the next calls of an operation
fail with a given HTTP error (throttling, 5xx, a quota).
"""

from __future__ import annotations

import base64
import datetime
import itertools
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from served_app import ServedApp

from clouds import checked, rules_vertex
from clouds.container import IMAGE

PROJECT, LOCATION, BUCKET = "tm-test", "us-central1", "tm-staging"
TOKEN = "fake-gcp-token"
SERVICE_ACCOUNT = f"tm@{PROJECT}.iam.gserviceaccount.com"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
BASE = "/v1/projects/{p}/locations/{l}/customJobs"
QUERY = {"create": {"$alt"}, "list": {"$alt", "filter", "pageSize", "pageToken"}, "get": {"$alt"}, "cancel": {"$alt"}}
FILTER = re.compile(r'^display_name="([^"]*)"$')


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _err(code: int, status: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "status": status, "message": message}}, status=code)


def _authorized(header: str) -> bool:
    """Our token from /token, or the self-signed JWT Google's clients send for a service account."""
    token = header.removeprefix("Bearer ")
    if token == TOKEN:
        return True
    try:
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    except (IndexError, ValueError):
        return False
    return claims.get("iss") == SERVICE_ACCOUNT and claims.get("exp", 0) > time.time()


class FakeVertex:
    def __init__(self):
        from google.cloud import aiplatform_v1 as v1

        self.v1 = v1
        self.jobs: dict[str, object] = {}
        self.log: list[tuple[str, str, str]] = []
        self.faults: dict[str, list[tuple[int, str, str]]] = {}
        self._ids = itertools.count(1000)
        self.app = web.Application(middlewares=[self._mw])
        r = self.app.router
        r.add_post("/token", self.token)
        r.add_post(BASE, self.create)
        r.add_get(BASE, self.list)
        r.add_get(BASE + "/{id}", self.get)
        r.add_post(BASE + "/{id}:cancel", self.cancel)

    def reset(self) -> None:
        self.jobs.clear()
        self.log.clear()
        self.faults.clear()

    def fail_next(self, operation: str, code: int, status: str, message: str, times: int = 1) -> None:
        """The next `times` calls of `operation` (create, list, get, cancel) answer this error."""
        self.faults.setdefault(operation, []).extend([(code, status, message)] * times)

    def calls(self, operation: str) -> int:
        method, tail = {"create": ("POST", "customJobs"), "list": ("GET", "customJobs"),
                        "cancel": ("POST", ":cancel")}[operation]
        return sum(1 for m, path, _ in self.log if m == method and path.endswith(tail))

    @web.middleware
    async def _mw(self, req, handler):
        if req.path == "/token":
            return await handler(req)
        self.log.append((req.method, req.path, req.query_string))
        if not _authorized(req.headers.get("Authorization", "")):
            return _err(401, "UNAUTHENTICATED", "missing or wrong access token")
        operation = getattr(handler, "__name__", "")
        if unknown := set(req.query) - QUERY.get(operation, set()):
            checked.record("vertex", operation, [f"unknown query parameters {sorted(unknown)}"])
            return _err(400, "INVALID_ARGUMENT", f"unknown query parameters {sorted(unknown)}")
        if operation != "create":  # create is checked with its body
            checked.record("vertex", operation, [])
        if self.faults.get(operation):
            return _err(*self.faults[operation].pop(0))
        return await handler(req)

    async def token(self, req):
        form = await req.post()
        if form.get("grant_type") != JWT_GRANT or form.get("assertion", "").count(".") != 2:
            return web.json_response({"error": "invalid_grant"}, status=400)
        return web.json_response({"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    def _name(self, req, jid=None) -> str:
        m = req.match_info
        return f"projects/{m['p']}/locations/{m['l']}/customJobs/{jid or m['id']}"

    def _out(self, msg) -> web.Response:
        return web.Response(text=type(msg).to_json(msg), content_type="application/json")

    async def create(self, req):
        job, found = rules_vertex.custom_job(await req.text())
        checked.record("vertex", "create", found)
        if found:
            return _err(400, "INVALID_ARGUMENT", "; ".join(found))
        job.name = self._name(req, next(self._ids))
        job.state, job.create_time, job.update_time = self.v1.JobState.JOB_STATE_PENDING, _now(), _now()
        self.jobs[job.name] = job
        return self._out(job)

    async def get(self, req):
        job = self.jobs.get(self._name(req))
        return self._out(job) if job else _err(404, "NOT_FOUND", f"{self._name(req)} not found")

    async def list(self, req):
        wanted = req.query.get("filter")
        match = FILTER.match(wanted) if wanted is not None else None
        if wanted is not None and match is None:
            return _err(400, "INVALID_ARGUMENT", f"filter not understood by the fake: {wanted}")
        jobs = [j for j in self.jobs.values() if match is None or j.display_name == match.group(1)]
        return self._out(self.v1.ListCustomJobsResponse(custom_jobs=jobs))

    async def cancel(self, req):
        job = self.jobs.get(self._name(req))
        if job is None:
            return _err(404, "NOT_FOUND", self._name(req))
        if job.state.name in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            return _err(400, "FAILED_PRECONDITION", f"job {job.name} is already in state {job.state.name}")
        job.state = self.v1.JobState.JOB_STATE_CANCELLING
        return web.json_response({})

    def by_display_name(self, display_name: str):
        return next(j for j in self.jobs.values() if j.display_name == display_name)

    def set_state(self, name: str, state: str, error: str | None = None, code: int = 13,
                  started: datetime.datetime | None = None, ended: datetime.datetime | None = None) -> None:
        """Test hook: the job's state (a JobState name), its error, and its start and end times."""
        job = self.jobs[name]
        job.state = self.v1.JobState[state]
        job.update_time = _now()
        if error:
            job.error = {"code": code, "message": error}
        if state == "JOB_STATE_RUNNING" and not job.start_time:
            job.start_time = started or _now()
        if state in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"):
            job.end_time = ended or _now()


@dataclass
class GcpServers:
    vertex: FakeVertex
    served: ServedApp
    gcs: object
    gcs_url: str
    key: str
    """A PEM RSA key the fake service account signs its token requests with."""

    @property
    def endpoint(self) -> str:
        return self.served.url

    def credentials_file(self, folder: Path) -> Path:
        """A service-account key (made here, for nothing but these servers) whose token endpoint is FakeVertex's."""
        path = folder / "gcp-key.json"
        path.write_text(json.dumps({"type": "service_account", "project_id": PROJECT, "private_key_id": "k1",
                                    "private_key": self.key, "client_email": SERVICE_ACCOUNT,
                                    "client_id": "1", "token_uri": f"{self.endpoint}/token"}))
        return path

    def config(self, credentials: Path, **extra) -> dict:
        """The `gcp:` section of backends.yaml pointing at these servers."""
        return {"project": PROJECT, "location": LOCATION, "staging_bucket": f"gs://{BUCKET}/runs",
                "api_endpoint": self.endpoint, "credentials_file": str(credentials), "image": IMAGE, "poll_s": 0.2,
                **extra}

    def reset(self) -> None:
        self.vertex.reset()
        self.gcs.wipe()
        self.storage_client().create_bucket(BUCKET)

    def storage_client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.gcs_url})

    def stop(self) -> None:
        self.served.stop()
        self.gcs.stop()


def start() -> GcpServers:
    from gcp_storage_emulator.server import create_server

    rules_vertex.install_storage()
    gcs = create_server("127.0.0.1", 0, in_memory=True)
    gcs.start()
    url = f"http://127.0.0.1:{gcs._api._httpd.server_address[1]}"
    vertex = FakeVertex()
    return GcpServers(vertex=vertex, served=ServedApp(vertex.app), gcs=gcs, gcs_url=url, key=_rsa_key())


def _rsa_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()

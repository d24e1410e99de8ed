"""Azure on 127.0.0.1 for the tests: a strict fake of the Azure ML REST API (the routes MLClient calls, over
HTTPS with a throw-away certificate) and Azurite (the Blob service, a node subprocess), both started once per
session (`start_azure`). Jobs never move by themselves: the test or its runner (azure_runner.py) sets them."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from served_app import ServedApp

WS = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/workspaces/{ws}"
RP = "Microsoft.MachineLearningServices/workspaces"
AZURITE = Path(__file__).resolve().parents[1] / "azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
JOB_FIELDS = {"jobType", "command", "computeId", "environmentId", "environmentVariables", "queueSettings",
              "experimentName", "displayName", "inputs", "outputs", "resources", "distribution", "limits", "tags",
              "properties", "isArchived", "services", "description", "codeId", "identity", "notificationSetting",
              "parentJobName", "componentId"}
"""What a command job PUT may carry (the SDK's RestCommandJob fields trainmaster leaves out are allowed absent)."""


def _err(status: int, code: str, message: str) -> web.Response:
    """An ARM error envelope; throttling and 5xx say when to come back (soon: the SDK's own retries wait)."""
    headers = {"Retry-After": "0.01"} if status == 429 or status >= 500 else None
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class FakeAzureML:
    """Jobs by name, as Azure ML's job resources; a log of every request; hooks to refuse or throttle."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.log: list[tuple[str, str, str]] = []
        self.faults: list[tuple[str, int, str, str]] = []
        """(method, status, code, message): the next job request of that method is answered so, one each."""
        self.refusing: str | None = None
        """When set, every job creation is refused with this capacity message (a 400, as Azure ML answers)."""
        self.app = web.Application(middlewares=[self._mw])
        r = self.app.router
        r.add_put(WS + "/jobs/{name}", self.put_job)
        r.add_get(WS + "/jobs/{name}", self.get_job)
        r.add_post(WS + "/jobs/{name}/cancel", self.cancel_job)
        r.add_put(WS + "/environments/{aname}/versions/{ver}", self.put_environment)
        r.add_get("/operations/{op}", self.op_status)
        r.add_route("*", "/{tail:.*}", self.unknown)

    def reset(self) -> None:
        self.jobs.clear()
        self.log.clear()
        self.faults.clear()
        self.refusing = None

    @web.middleware
    async def _mw(self, req, handler):
        self.log.append((req.method, req.path, await req.text() if req.can_read_body else ""))
        fault = next((f for f in self.faults if f[0] == req.method), None) if "/jobs" in req.path else None
        if fault:
            self.faults.remove(fault)
            return _err(*fault[1:])
        return await handler(req)

    async def unknown(self, req):
        return _err(404, "NotImplementedInFake", f"{req.method} {req.path}")

    async def op_status(self, req):
        return web.json_response({})

    async def put_job(self, req):
        name, body = req.match_info["name"], await req.json()
        props = body.get("properties", {})
        unknown = set(body) - {"properties"} or set(props) - JOB_FIELDS
        if unknown:
            return _err(400, "UserError", f"unknown fields {sorted(unknown)}")
        if props.get("jobType") != "Command" or not props.get("command") or not props.get("environmentId"):
            return _err(400, "UserError", "a command job needs jobType Command, a command and an environment")
        if self.refusing:
            return _err(400, "UserError", self.refusing)
        if name in self.jobs:
            return _err(409, "Conflict", f"job {name} already exists")
        props["status"] = "NotStarted"
        props["services"] = {"Studio": {"endpoint": f"https://ml.azure.com/runs/{name}", "jobServiceType": "Studio"}}
        self.jobs[name] = {"id": req.path, "name": name, "type": f"{RP}/jobs", "properties": props,
                           "systemData": {"createdAt": _now(), "createdBy": "fake", "createdByType": "User"}}
        return web.json_response(self.jobs[name], status=201)

    async def get_job(self, req):
        job = self.jobs.get(req.match_info["name"])
        return web.json_response(job) if job else _err(404, "UserError", "job not found")

    async def cancel_job(self, req):
        job = self.jobs.get(req.match_info["name"])
        if job is None:
            return _err(404, "UserError", "job not found")
        job["properties"]["status"] = "CancelRequested"
        loc = f"{req.scheme}://{req.host}/operations/{uuid.uuid4().hex}"
        return web.Response(status=202, headers={"Location": loc, "Retry-After": "0"})

    async def put_environment(self, req):
        props = (await req.json()).get("properties", {})
        unknown = set(props) - {"image", "isAnonymous", "isArchived", "osType", "description", "tags", "properties"}
        if unknown or not props.get("image"):
            return _err(400, "UserError", f"an environment needs an image; unknown fields {sorted(unknown)}")
        m = req.match_info
        return web.json_response({"id": req.path, "name": m["ver"], "type": f"{RP}/environments/versions",
                                  "properties": props}, status=201)

    def set_status(self, name: str, status: str, error: str | None = None, start: float | None = None,
                   end: float | None = None) -> None:
        """Test hook: the job's status, its failure text and its start/end times (Unix time)."""
        props = self.jobs[name]["properties"]
        props["status"] = status
        extra = props.setdefault("properties", {})
        if error:
            extra["Error"] = error
        for key, value in (("StartTimeUtc", start), ("EndTimeUtc", end)):
            if value is not None:
                extra[key] = datetime.datetime.fromtimestamp(value, datetime.timezone.utc).isoformat()

    def properties(self, name: str) -> dict:
        return self.jobs[name]["properties"]


def make_cert(folder: Path) -> tuple[str, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1 (the PEM path clients trust) and the server's SSL context."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_path, key_path)
    return str(cert_path), ctx


class Azurite:
    """`azurite-blob` on a free port, in memory; `stop()` ends it."""

    def __init__(self, folder: Path):
        if not AZURITE.exists():
            raise RuntimeError(f"Azurite is not installed ({AZURITE}): run `./dev test` (it runs npm ci in tests/azurite)")
        self.proc = subprocess.Popen(
            [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
             "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder)
        for line in self.proc.stdout:
            if "successfully listens" in line:
                self.port = int(line.rsplit(":", 1)[1].strip().split()[0].rstrip("/"))
                break
        else:
            raise RuntimeError(f"Azurite did not start (rc {self.proc.wait()})")
        self.url = f"http://127.0.0.1:{self.port}/{ACCOUNT}"
        self.connection_string = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                                  f"BlobEndpoint={self.url};")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.proc.stdout.close()


@dataclass
class AzureServers:
    fake: FakeAzureML
    served: ServedApp
    azurite: Azurite
    cert: str

    @property
    def env(self) -> dict[str, str]:
        """The variables that point the SDKs (in this process or a subprocess) at these servers."""
        return {"AZUREML_DEV_URL_MFE": self.served.url, "REQUESTS_CA_BUNDLE": self.cert,
                "AZURE_STORAGE_CONNECTION_STRING": self.azurite.connection_string,
                "AZURE_SUBSCRIPTION_ID": "00000000-0000-0000-0000-000000000000"}

    def stop(self) -> None:
        self.served.stop()
        self.azurite.stop()


def start_azure() -> AzureServers:
    folder = Path(tempfile.mkdtemp(prefix="tm-azure-"))
    cert, ctx = make_cert(folder)
    fake = FakeAzureML()
    return AzureServers(fake, ServedApp(fake.app, ssl_context=ctx), Azurite(folder), cert)

"""Azure on 127.0.0.1 for the tests: a strict fake of the Azure ML REST API (the routes MLClient calls, over
HTTPS with a throw-away certificate) and Azurite (the Blob service, a node subprocess), both started once per
session (`start_azure`). Jobs never move by themselves: the test or its runner (azure_runner.py) sets them.

Every request is checked against Azure ML's REST rules first (clouds/rules_azureml.py: names, the command job's
properties, input and output types, modes and URIs, the datastores the workspace has); one the service would
refuse is answered 400 UserError and recorded (clouds/checked.py). A job resource holds what the REST API's
JobBase documents and nothing the fake invents: its properties as sent, `status`, `services` (Studio and
Tracking), and `systemData` (createdAt, lastModifiedAt: changed with each status). No start or end time and no
error text: the job resource has none."""

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

from clouds import checked, rules_azureml

WS = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/workspaces/{ws}"
RP = "Microsoft.MachineLearningServices/workspaces"
AZURITE = Path(__file__).resolve().parents[1] / "azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _err(status: int, code: str, message: str) -> web.Response:
    """An ARM error envelope; throttling and 5xx say when to come back (soon: the SDK's own retries wait)."""
    headers = {"Retry-After": "0.01"} if status == 429 or status >= 500 else None
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class FakeAzureML:
    """Jobs by name, as Azure ML's job resources; the workspace's datastores and environments; a log of every
    request; hooks to refuse or throttle."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.datastores: dict[str, str] = {}
        """The workspace's datastores: name -> the Blob container it names (the user's one-time set-up)."""
        self.environments: dict[str, str] = {}
        """Environment version ARM path -> its image."""
        self.log: list[tuple[str, str, str]] = []
        self.faults: list[tuple[str, int, str, str]] = []
        """(method, status, code, message): the next job request of that method is answered so, one each."""
        self.refusing: str | None = None
        """When set, every job creation is refused with this message (a 400, as Azure ML answers a quota)."""
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
        self.datastores.clear()
        self.refusing = None

    @web.middleware
    async def _mw(self, req, handler):
        self.log.append((req.method, req.path, await req.text() if req.can_read_body else ""))
        fault = next((f for f in self.faults if f[0] == req.method), None) if "/jobs" in req.path else None
        if fault:
            self.faults.remove(fault)
            return _err(*fault[1:])
        operation = getattr(handler, "__name__", "")
        if operation in ("get_job", "cancel_job"):
            found = rules_azureml.name_problems("job", req.match_info["name"])
            checked.record("azureml", operation, found)
            if found:
                return _err(400, "UserError", "; ".join(found))
        elif operation == "op_status":
            checked.record("azureml", operation, [])
        return await handler(req)

    async def unknown(self, req):
        return _err(404, "NotImplementedInFake", f"{req.method} {req.path}")

    async def op_status(self, req):
        return web.json_response({})

    async def put_job(self, req):
        name, body = req.match_info["name"], await req.json()
        found = rules_azureml.job_problems(name, body, set(self.datastores))
        checked.record("azureml", "put_job", found)
        if found:
            return _err(400, "UserError", "; ".join(found))
        props = body["properties"]
        if self.refusing:
            return _err(400, "UserError", self.refusing)
        if name in self.jobs:
            return _err(409, "Conflict", f"job {name} already exists")
        props["status"] = "NotStarted"
        props["services"] = {"Studio": {"endpoint": f"https://ml.azure.com/runs/{name}", "jobServiceType": "Studio"},
                             "Tracking": {"endpoint": "azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/…",
                                          "jobServiceType": "Tracking"}}
        now = _now()
        self.jobs[name] = {"id": req.path, "name": name, "type": f"{RP}/jobs", "properties": props,
                           "systemData": {"createdAt": now, "createdBy": "fake", "createdByType": "User",
                                          "lastModifiedAt": now, "lastModifiedBy": "fake",
                                          "lastModifiedByType": "User"}}
        return web.json_response(self.jobs[name], status=201)

    async def get_job(self, req):
        job = self.jobs.get(req.match_info["name"])
        return web.json_response(job) if job else _err(404, "UserError", "job not found")

    async def cancel_job(self, req):
        job = self.jobs.get(req.match_info["name"])
        if job is None:
            return _err(404, "UserError", "job not found")
        self.set_status(req.match_info["name"], "CancelRequested")
        loc = f"{req.scheme}://{req.host}/operations/{uuid.uuid4().hex}"
        return web.Response(status=202, headers={"Location": loc, "Retry-After": "0"})

    async def put_environment(self, req):
        m, body = req.match_info, await req.json()
        found = rules_azureml.environment_problems(m["aname"], m["ver"], body)
        checked.record("azureml", "put_environment", found)
        if found:
            return _err(400, "UserError", "; ".join(found))
        props = body["properties"]
        self.environments[req.path] = props["image"]
        return web.json_response({"id": req.path, "name": m["ver"], "type": f"{RP}/environments/versions",
                                  "properties": props}, status=201)

    def set_status(self, name: str, status: str) -> None:
        """Test hook: the job's status, as the service changes it (systemData.lastModifiedAt moves with it)."""
        job = self.jobs[name]
        job["properties"]["status"] = status
        job["systemData"]["lastModifiedAt"] = _now()

    def properties(self, name: str) -> dict:
        return self.jobs[name]["properties"]

    def image(self, name: str) -> str | None:
        """The image of the job's environment (its environmentId names a version this workspace holds)."""
        environment = self.jobs[name]["properties"]["environmentId"]
        return next((image for path, image in self.environments.items()
                     if environment.lower().endswith(path.lower())), None)


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

"""The Ray cluster as the Ray backend talks to it, over its dashboard: its live nodes and what each has free
(two HTTP GETs, Ray not imported: the state API's node list, and the autoscaler's per-node usage report, which
the head's monitor refreshes every few seconds), and its jobs through the Jobs API: submitted with its client
(`ray.job_submission`, imported on first use: it packs and uploads the working dir; it blocks, so the backend
runs it with `asyncio.to_thread`), read and stopped over its REST routes (`GET /api/jobs/<id>`,
`POST /api/jobs/<id>/stop`). Our own requests go over aiohttp (the project's one HTTP client library), each
with a timeout, so a head that stops answering fails the call rather than holding it. Errors are the core's:
the dashboard unreachable, slow or answering 5xx → TransientBackendError; a refusal → BackendError saying what
Ray said.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from urllib.parse import quote

from trainmaster.backends.base import BackendError, TransientBackendError

NODES_PATH = "/api/v0/nodes?limit=10000&detail=true"
USAGE_PATH = "/api/cluster_status"
MAX_BODY_BYTES = 2**24
MAX_RECORD_BYTES = 2**16
ACCELERATOR = "accelerator_type:"
STATUS_CODE = re.compile(r"status code (\d{3})")


@dataclass(frozen=True)
class Node:
    """One live node: what it has free now (its total less what Ray's tasks, actors and placement groups hold;
    Ray's own view: `ray start --num-cpus/--num-gpus`), and its GPUs' type."""

    node_id: str
    ip: str
    head: bool
    cpus: int
    memory_mb: int
    gpus: int
    gpu_type: str | None


@dataclass(frozen=True)
class RayJob:
    """What the Jobs API says of one submission (times as Unix seconds)."""

    status: str
    """PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED."""
    message: str
    error_type: str | None
    started_at: float | None
    ended_at: float | None


async def nodes(address: str, timeout: float) -> list[Node]:
    """The cluster's live nodes and what each has free; TransientBackendError when the dashboard does not answer.
    A node the usage report does not hold yet (it joined since the monitor's last round) counts as all free."""
    listed = await _request(address, NODES_PATH, timeout, "its node list")
    report = await _request(address, USAGE_PATH, timeout, "its cluster status")
    try:
        usage = (((report["data"].get("clusterStatus") or {}).get("loadMetricsReport") or {}).get("usageByNode")
                 or {})
        return [_node(item, usage.get(item["node_id"], {})) for item in listed["data"]["result"]["result"]
                if item.get("state") == "ALIVE"]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise BackendError(f"the Ray dashboard at {address} sent a node list that does not read ({exc!r})") from None


async def _request(address: str, path: str, timeout: float, what: str, method: str = "GET") -> dict:
    """The dashboard's JSON answer to one request, within `timeout` seconds in all."""
    import aiohttp

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.request(method, address.rstrip("/") + path) as resp:
                body = await _read(resp, MAX_BODY_BYTES if resp.status < 400 else MAX_RECORD_BYTES)
                status = resp.status
    except asyncio.TimeoutError:
        raise TransientBackendError(f"the Ray dashboard at {address} does not answer: no answer to {what} "
                                    f"within {timeout:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise TransientBackendError(f"the Ray dashboard at {address} does not answer: {why}") from None
    if status >= 400:
        error = TransientBackendError if status >= 500 else BackendError
        said = _last_line(body.decode(errors="replace"))
        raise error(f"the Ray dashboard at {address} answered HTTP {status} to {what}: {said}")
    try:
        return json.loads(body)
    except ValueError as exc:
        raise TransientBackendError(f"the Ray dashboard at {address} does not answer: {what} is not JSON "
                                    f"({exc})") from None


async def _read(resp, limit: int) -> bytes:
    """At most `limit` bytes of the answer's body (a larger one is cut there, and then does not read as JSON)."""
    body = bytearray()
    async for chunk in resp.content.iter_chunked(1 << 16):
        body += chunk[:limit - len(body)]
        if len(body) >= limit:
            break
    return bytes(body)


def _node(item: dict, usage: dict) -> Node:
    """A node from its totals (the state API) less what the usage report says is in use ({resource: [used,
    total]}, resource names as the dashboard spells them: CPU, GPU, memory in bytes)."""
    total = item["resources_total"]
    types = [key[len(ACCELERATOR):] for key in total if key.startswith(ACCELERATOR)]

    def free(name: str) -> float:
        used = usage.get(name, [0.0])[0]
        return max(0.0, float(total.get(name, 0)) - float(used))

    return Node(node_id=str(item["node_id"]), ip=str(item["node_ip"]), head=bool(item.get("is_head_node")),
                cpus=int(free("CPU")), memory_mb=int(free("memory")) // 2**20, gpus=int(free("GPU")),
                gpu_type=types[0] if types else None)


def quiet_ray() -> None:
    """Ray sets its own loggers up as it is imported (INFO, on a stderr handler of its own), so its "Uploading
    package …" lines would land in the output of a command that submits; they are kept to warnings unless
    trainmaster itself logs info (`trainmaster -v`, TRAINMASTER_LOG_LEVEL)."""
    import logging

    if logging.getLogger("trainmaster").getEffectiveLevel() > logging.INFO:
        for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
            logging.getLogger(name).setLevel(logging.WARNING)


class Jobs:
    """The cluster's Jobs API; the client is made on first submit and kept (making one asks the dashboard)."""

    def __init__(self, address: str, timeout: float):
        self.address, self.timeout = address, timeout
        self._client = None

    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            quiet_ray()
            self._client = self._call(JobSubmissionClient, self.address)
        return self._client

    def submit(self, submission_id: str, *, entrypoint: str, working_dir: str, env: dict[str, str], cpus: int,
               gpus: int, pip: dict | None = None) -> None:
        """Submit once: a submission of that id already there is the one submitted before (no second one).
        `pip`: Ray's runtime environment of packages (`{"packages", "pip_install_options"}`), installed into a
        virtualenv over the node's interpreter before the entrypoint starts, on every node the job uses."""
        runtime_env = {"working_dir": working_dir, "env_vars": env, **({"pip": pip} if pip else {})}
        try:
            self._call(self.client().submit_job, entrypoint=entrypoint, submission_id=submission_id,
                       runtime_env=runtime_env, entrypoint_num_cpus=cpus, entrypoint_num_gpus=gpus)
        except BackendError as exc:
            if "already exists" not in str(exc):
                raise

    async def info(self, submission_id: str) -> RayJob:
        info = await _request(self.address, f"/api/jobs/{quote(submission_id)}", self.timeout, f"job {submission_id}")
        try:
            return RayJob(status=str(info["status"]), message=str(info.get("message") or ""),
                          error_type=info.get("error_type"),
                          started_at=info["start_time"] / 1000 if info.get("start_time") else None,
                          ended_at=info["end_time"] / 1000 if info.get("end_time") else None)
        except (KeyError, TypeError) as exc:
            raise BackendError(f"the Ray Jobs API sent job {submission_id} in a form that does not read "
                               f"({exc!r})") from None

    async def stop(self, submission_id: str) -> None:
        """Ask Ray to stop the job (SIGTERM to its entrypoint, SIGKILL past Ray's grace); an ended job stays as it is."""
        await _request(self.address, f"/api/jobs/{quote(submission_id)}/stop", self.timeout, f"stop {submission_id}", "POST")

    def _call(self, method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except OSError as exc:  # requests' and the client's own connection errors are OSErrors
            raise TransientBackendError(f"the Ray Jobs API at {self.address} does not answer: {exc}") from None
        except RuntimeError as exc:  # the client's word for any HTTP error, its status code in the text
            found = STATUS_CODE.search(str(exc))
            server_side = found is not None and int(found.group(1)) >= 500 and "already exists" not in str(exc)
            error = TransientBackendError if server_side else BackendError
            raise error(f"the Ray Jobs API refused: {_last_line(str(exc))}") from None


def _last_line(text: str) -> str:
    """Ray's error text ends with the reason after a server-side traceback: keep the reason."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and line.strip() != "."]
    return lines[-1][:500] if lines else text[:500]

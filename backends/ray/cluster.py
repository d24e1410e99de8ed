"""The Ray cluster as the Ray backend talks to it: its live nodes over the dashboard's REST state API (one HTTP
GET with a timeout, Ray not imported), and its jobs through the Jobs API client (`ray.job_submission`, imported
on first use). Every call blocks: the backend runs them with `asyncio.to_thread`. Errors are the core's: the
dashboard unreachable or answering 5xx → TransientBackendError; a refusal → BackendError saying what Ray said.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from trainmaster.backends.base import BackendError, TransientBackendError

NODES_PATH = "/api/v0/nodes?limit=10000&detail=true"
MAX_BODY_BYTES = 2**24
ACCELERATOR = "accelerator_type:"
STATUS_CODE = re.compile(r"status code (\d{3})")


@dataclass(frozen=True)
class Node:
    """One live node, from its total resources (Ray's own view: `ray start --num-cpus/--num-gpus`)."""

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


def nodes(address: str, timeout: float) -> list[Node]:
    """The cluster's live nodes; TransientBackendError when the dashboard does not answer."""
    url = address.rstrip("/") + NODES_PATH
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.loads(resp.read(MAX_BODY_BYTES))
    except urllib.error.HTTPError as exc:
        error = TransientBackendError if exc.code >= 500 else BackendError
        raise error(f"the Ray dashboard at {address} answered HTTP {exc.code} to its node list") from None
    except (OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise TransientBackendError(f"the Ray dashboard at {address} does not answer: {why}") from None
    try:
        listed = body["data"]["result"]["result"]
        return [_node(item) for item in listed if item.get("state") == "ALIVE"]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise BackendError(f"the Ray dashboard at {address} sent a node list that does not read ({exc!r})") from None


def _node(item: dict) -> Node:
    total = item["resources_total"]
    types = [key[len(ACCELERATOR):] for key in total if key.startswith(ACCELERATOR)]
    return Node(node_id=str(item["node_id"]), ip=str(item["node_ip"]), head=bool(item.get("is_head_node")),
                cpus=int(total.get("CPU", 0)), memory_mb=int(total.get("memory", 0)) // 2**20,
                gpus=int(total.get("GPU", 0)), gpu_type=types[0] if types else None)


class Jobs:
    """The cluster's Jobs API; the client is made on first use and kept (making one asks the dashboard)."""

    def __init__(self, address: str):
        self.address = address
        self._client = None

    def client(self):
        if self._client is None:
            from ray.job_submission import JobSubmissionClient

            self._client = self._call(JobSubmissionClient, self.address)
        return self._client

    def submit(self, submission_id: str, *, entrypoint: str, working_dir: str, env: dict[str, str], cpus: int,
               gpus: int) -> None:
        """Submit once: a submission of that id already there is the one submitted before (no second one)."""
        try:
            self._call(self.client().submit_job, entrypoint=entrypoint, submission_id=submission_id,
                       runtime_env={"working_dir": working_dir, "env_vars": env}, entrypoint_num_cpus=cpus,
                       entrypoint_num_gpus=gpus)
        except BackendError as exc:
            if "already exists" not in str(exc):
                raise

    def info(self, submission_id: str) -> RayJob:
        info = self._call(self.client().get_job_info, submission_id)
        return RayJob(status=info.status.value, message=info.message or "", error_type=info.error_type,
                      started_at=info.start_time / 1000 if info.start_time else None,
                      ended_at=info.end_time / 1000 if info.end_time else None)

    def stop(self, submission_id: str) -> None:
        """Ask Ray to stop the job (SIGTERM to its entrypoint, SIGKILL past Ray's grace); an ended job stays as it is."""
        self._call(self.client().stop_job, submission_id)

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

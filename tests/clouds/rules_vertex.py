"""Vertex AI's and Cloud Storage's own rules, checked on every request FakeVertex and the storage emulator receive.

A CustomJob is read back strictly through its own protos (`aiplatform_v1.CustomJob.from_json` with unknown
fields refused: a field or enum value the API does not have fails), then held to the constraints the API
documents beyond its types (google/cloud/aiplatform/v1/custom_job.proto and the Vertex AI docs):

* `display_name` required, at most 128 characters;
* labels: at most 64; keys 1-63 characters of lowercase letters, digits, `_` and `-`, starting with a letter;
  values at most 63 of the same (international lowercase letters allowed);
* at least one worker pool, the first of exactly one replica; every pool's machine type and image set,
  an accelerator count only with an accelerator type (and its type a known one);
* environment variable names are C identifiers;
* `scheduling.max_wait_duration` only with the FLEX_START strategy, the only one it applies to;
* `base_output_directory.output_uri_prefix` a gs:// URI.

Cloud Storage (the emulator's requests): bucket names of 3-63 characters (`a-z0-9-_.`, starting and ending with a
letter or digit), object names of 1-1024 UTF-8 bytes without carriage return or line feed.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qs, unquote, urlparse

import regex

from clouds import checked

MAX_DISPLAY_NAME = 128
MAX_LABELS = 64
LABEL_KEY = regex.compile(r"[\p{Ll}\p{Lo}][\p{Ll}\p{Lo}\p{N}_-]{0,62}")
LABEL_VALUE = regex.compile(r"[\p{Ll}\p{Lo}\p{N}_-]{0,63}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DURATION = re.compile(r"\d+(\.\d+)?s")
BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")


def custom_job(text: str) -> tuple[object | None, list[str]]:
    """The CustomJob of a create request's body and what breaks the API's rules in it."""
    from google.cloud import aiplatform_v1 as v1

    try:
        job = v1.CustomJob.from_json(text, ignore_unknown_fields=False)
    except Exception as exc:  # noqa: BLE001 - what the protos refuse, the API refuses
        return None, [f"the body is not a CustomJob: {exc}"]
    found = []
    if not job.display_name:
        found.append("display_name is required")
    if len(job.display_name) > MAX_DISPLAY_NAME:
        found.append(f"display_name of {len(job.display_name)} characters (at most {MAX_DISPLAY_NAME})")
    if len(job.labels) > MAX_LABELS:
        found.append(f"{len(job.labels)} labels (at most {MAX_LABELS})")
    for key, value in job.labels.items():
        if not LABEL_KEY.fullmatch(key):
            found.append(f"label key {key!r} breaks the label rules")
        if not LABEL_VALUE.fullmatch(value):
            found.append(f"label value {value!r} of {key!r} breaks the label rules")
    pools = job.job_spec.worker_pool_specs
    if not pools:
        found.append("job_spec.worker_pool_specs needs at least one pool")
    elif pools[0].replica_count != 1:
        found.append(f"worker pool 0 has {pools[0].replica_count} replicas: the primary pool takes exactly 1")
    for i, pool in enumerate(pools):
        where = f"worker_pool_specs[{i}]"
        if pool.replica_count < 1:
            found.append(f"{where}.replica_count must be at least 1")
        if not pool.machine_spec.machine_type:
            found.append(f"{where}.machine_spec.machine_type is required")
        kind = pool.machine_spec.accelerator_type
        if pool.machine_spec.accelerator_count and kind == v1.AcceleratorType.ACCELERATOR_TYPE_UNSPECIFIED:
            found.append(f"{where}.machine_spec: an accelerator count without an accelerator type")
        if not pool.container_spec.image_uri:
            found.append(f"{where}.container_spec.image_uri is required")
        for env in pool.container_spec.env:
            if not ENV_NAME.fullmatch(env.name):
                found.append(f"{where}.container_spec.env: {env.name!r} is not a C identifier")
    scheduling = job.job_spec.scheduling
    raw = json.loads(text).get("jobSpec", {}).get("scheduling", {})
    if "maxWaitDuration" in raw and scheduling.strategy != v1.Scheduling.Strategy.FLEX_START:
        found.append(f"scheduling.max_wait_duration applies to FLEX_START only, not {scheduling.strategy.name}")
    for field in ("timeout", "maxWaitDuration"):
        if field in raw and not DURATION.fullmatch(str(raw[field])):
            found.append(f"scheduling.{field} {raw[field]!r} is not a duration")
    prefix = job.job_spec.base_output_directory.output_uri_prefix
    if prefix and not prefix.startswith("gs://"):
        found.append(f"base_output_directory.output_uri_prefix {prefix!r} is not a gs:// URI")
    return job, found


def object_problems(bucket: str | None, name: str | None) -> list[str]:
    found = []
    if bucket is not None and (not BUCKET.fullmatch(bucket) or ".." in bucket):
        found.append(f"bucket name {bucket!r} breaks Cloud Storage's naming rules")
    if name is not None:
        size = len(name.encode())
        if not 1 <= size <= 1024:
            found.append(f"object name of {size} bytes (1-1024)")
        if "\r" in name or "\n" in name or name in (".", ".."):
            found.append(f"object name {name!r} is not allowed")
    return found


PATHS = [re.compile(p) for p in (r"(?:/storage/v1|/upload/storage/v1|/download/storage/v1)?/b/(?P<bucket>[^/]+)"
                                 r"(?:/o(?:/(?P<name>.+?))?)?(?:/(?:copyTo|rewriteTo)/.*)?",)]


def storage_request(path_qs: str) -> tuple[str, list[str]]:
    """(operation, problems) of a Cloud Storage JSON API request."""
    url = urlparse(path_qs)
    query = parse_qs(url.query)
    bucket = name = None
    for pattern in PATHS:
        match = pattern.fullmatch(url.path)
        if match:
            bucket = unquote(match["bucket"])
            name = unquote(match["name"]) if match["name"] else None
            break
    if name is None and "name" in query:
        name = query["name"][0]
    return url.path.rsplit("/", 1)[-1] or "/", object_problems(bucket, name)


def install_storage() -> None:
    """Check every request the storage emulator receives (idempotent)."""
    from http import HTTPStatus

    from gcp_storage_emulator import server

    if getattr(server.Router, "_tm_checked", False):
        return
    original = server.Router.handle

    def handle(self, method):
        path = self._request_handler.path
        if path in ("/", "/wipe"):
            return original(self, method)
        operation, found = storage_request(path)
        checked.record("gcs", f"{method} {operation}", found)
        if found:
            length = int(self._request_handler.headers.get("Content-Length") or 0)
            if length:
                self._request_handler.rfile.read(length)  # the connection stays usable
            response = server.Response(self._request_handler)
            response.status = HTTPStatus.BAD_REQUEST
            response.json({"error": {"code": 400, "message": "; ".join(found), "errors": [{"reason": "invalid"}]}})
            response.close()
            return None
        return original(self, method)

    server.Router.handle = handle
    server.Router._tm_checked = True

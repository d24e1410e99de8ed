"""SageMaker's and S3's own rules, from the service model botocore ships (`botocore/data/<service>/*/service-2.json`).

botocore's client-side validator checks types, required members and `min` only; the service also enforces every
shape's `max`, `pattern` and `enum`. `problems(service, operation, params)` walks the operation's input shape
over the request as the service received it — structure members (unknown ones refused), list members, map keys
and values — and applies to each value its shape's rules: `min`/`max` to string lengths, list and map sizes and
numbers, `pattern` as a whole-value match (Java's `String.matches`, through the `regex` package: Java's
surrogate-pair ranges become the code points they stand for), `enum` as the allowed strings.

`install()` patches moto (before its server starts, in the same process) so every SageMaker request (JSON
protocol: the body is the operation's input) and every S3 request (REST: the bucket name and key of the URL
against S3's naming rules: 3-63 characters of `[a-z0-9.-]`, a key of 1-1024 UTF-8 bytes) is checked; a
violation is answered `ValidationException` (SageMaker) or `InvalidBucketName` / `KeyTooLongError` (S3), as the
services answer, and recorded in `clouds.checked`.
"""

from __future__ import annotations

import functools
import json
from urllib.parse import unquote, urlparse
from xml.sax.saxutils import escape

import regex

from clouds import checked

JAVA_FIXES = {r"\uD800\uDC00-\uDBFF\uDFFF": r"\U00010000-\U0010FFFF", r"\p{Cntrl}": r"\p{Cc}",
              r"\p{Alnum}": r"[\p{L}\p{N}]"}


@functools.lru_cache(maxsize=4)
def model(service: str):
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


@functools.lru_cache(maxsize=2048)
def _compiled(pattern: str):
    for java, python in JAVA_FIXES.items():
        pattern = pattern.replace(java, python)
    return regex.compile(pattern)


def problems(service: str, operation: str, params: dict) -> list[str]:
    try:
        shape = model(service).operation_model(operation).input_shape
    except Exception as exc:  # noqa: BLE001 - an operation the model does not have is itself a violation
        return [f"no operation {operation} in {service}'s model ({exc})"]
    found: list[str] = []
    if shape is not None:
        _walk(shape, params, operation, found)
    return found


def _size_rules(meta: dict, size: int, what: str, path: str, found: list[str]) -> None:
    if "min" in meta and size < meta["min"]:
        found.append(f"{path}: {what} {size} is below the minimum {meta['min']}")
    if "max" in meta and size > meta["max"]:
        found.append(f"{path}: {what} {size} is above the maximum {meta['max']}")


def _walk(shape, value, path: str, found: list[str]) -> None:
    kind, meta = shape.type_name, shape.metadata
    if kind == "structure":
        if not isinstance(value, dict):
            found.append(f"{path}: a structure, not {type(value).__name__}")
            return
        for name in shape.required_members:
            if name not in value:
                found.append(f"{path}.{name}: required")
        for name, item in value.items():
            if name not in shape.members:
                found.append(f"{path}.{name}: not a member of {shape.name}")
            else:
                _walk(shape.members[name], item, f"{path}.{name}", found)
    elif kind == "list":
        if not isinstance(value, list):
            found.append(f"{path}: a list, not {type(value).__name__}")
            return
        _size_rules(meta, len(value), "length", path, found)
        for i, item in enumerate(value):
            _walk(shape.member, item, f"{path}[{i}]", found)
    elif kind == "map":
        if not isinstance(value, dict):
            found.append(f"{path}: a map, not {type(value).__name__}")
            return
        _size_rules(meta, len(value), "entries", path, found)
        for key, item in value.items():
            _walk(shape.key, key, f"{path} key {key!r}", found)
            _walk(shape.value, item, f"{path}[{key!r}]", found)
    elif kind == "string":
        if not isinstance(value, str):
            found.append(f"{path}: a string, not {type(value).__name__}")
            return
        _size_rules(meta, len(value), "length", path, found)
        if shape.enum and value not in shape.enum:
            found.append(f"{path}: {value!r} is not one of the {len(shape.enum)} allowed values")
        if "pattern" in meta and _compiled(meta["pattern"]).fullmatch(value) is None:
            found.append(f"{path}: {value[:80]!r} does not match {meta['pattern']!r}")
    elif kind in ("integer", "long", "float", "double"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            found.append(f"{path}: a number, not {type(value).__name__}")
            return
        _size_rules(meta, value, "value", path, found)
    elif kind == "boolean":
        if not isinstance(value, bool):
            found.append(f"{path}: a boolean, not {type(value).__name__}")
    elif kind == "blob":
        _size_rules(meta, len(value), "size", path, found)


BUCKET = regex.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def s3_problems(bucket: str | None, key: str | None) -> list[str]:
    """S3's naming rules for the bucket and key of a request's URL."""
    found = []
    if bucket and (BUCKET.fullmatch(bucket) is None or ".." in bucket):
        found.append(f"bucket name {bucket!r} breaks S3's naming rules")
    if key is not None and not 1 <= len(key.encode()) <= 1024:
        found.append(f"key of {len(key.encode())} bytes (S3 takes 1-1024)")
    return found


def install() -> None:
    """Check every SageMaker and S3 request moto receives (idempotent)."""
    from moto.core.exceptions import JsonRESTError
    from moto.s3.responses import S3Response
    from moto.sagemaker.responses import SageMakerResponse

    if getattr(SageMakerResponse, "_tm_checked", False):
        return
    original_call = SageMakerResponse.call_action

    def call_action(self):
        operation = self._get_action()
        try:
            params = json.loads(self.body or "{}")
        except ValueError:
            params = None
        found = problems("sagemaker", operation, params) if isinstance(params, dict) else ["the body is not JSON"]
        checked.record("sagemaker", operation, found)
        if found:
            raise JsonRESTError("ValidationException", f"{len(found)} validation error(s) detected: "
                                + "; ".join(found[:5]))
        return original_call(self)

    def wrap(original):
        def checked_response(self, request, full_url, headers):
            path = urlparse(full_url).path
            parts = path.lstrip("/").split("/", 1)
            bucket = unquote(parts[0]) if parts[0] else None
            key = unquote(parts[1]) if len(parts) > 1 and parts[1] else None
            if request.path.startswith("/moto-api"):
                return original(self, request, full_url, headers)
            found = s3_problems(bucket, key)
            checked.record("s3", request.method, found)
            if found:
                code = "KeyTooLongError" if "key of" in found[0] else "InvalidBucketName"
                message = escape("; ".join(found))
                body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}'
                        "</Message></Error>")
                return 400, {"Content-Type": "application/xml"}, body.encode()
            return original(self, request, full_url, headers)
        return checked_response

    SageMakerResponse.call_action = call_action
    S3Response.bucket_response = wrap(S3Response.bucket_response)
    S3Response.key_response = wrap(S3Response.key_response)
    SageMakerResponse._tm_checked = True

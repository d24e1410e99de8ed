"""The executor harness protocol, version 1: JSON over HTTP, every route under /v1, files as raw byte
streams that resume from an offset. What both sides import, and all they share.

A request the executor refuses gets a JSON body {"error": reason} with a 4xx status (404: no such
attempt); a 5xx is a fault that may pass. A file's size and sha256 are announced in a manifest before
its bytes are asked for, so the receiver checks both (`backends.transfer.download`).
"""

from __future__ import annotations

import base64
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.backends.base import OutputFile

VERSION = 1
PREFIX = f"/v{VERSION}"
URL_ENV = "TRAINMASTER_TEST_EXECUTOR_URL"
"""Where the client finds the executor (the registry builds backends from their config only)."""

HELLO = f"{PREFIX}/hello"  # GET -> {"protocol": 1, "hotkeys": [...]}
OFFERS = f"{PREFIX}/offers"  # POST {"request": OfferRequest} -> OfferSet
BUNDLE = PREFIX + "/bundles/{sha256}"  # PUT the tar as the body -> {"sha256", "size"}; refused on a mismatch
ATTEMPTS = f"{PREFIX}/attempts"  # POST {"spec", "offer", "context"} -> {"attempt_id", "hotkey"}
ATTEMPT = PREFIX + "/attempts/{attempt_id}"
STATUS = ATTEMPT + "/status"  # GET -> AttemptStatus
LOGS = ATTEMPT + "/logs"  # GET ?offset= -> LogChunk
METRICS = ATTEMPT + "/metrics"  # GET ?offset=&limit= -> {"data": base64, "offset", "size", "modified_at"}
CHECKPOINT = ATTEMPT + "/checkpoint"  # GET -> {"uri": an opaque reference or null}
CANCEL = ATTEMPT + "/cancel"  # POST -> {"stopped": processes}
OUTPUTS = ATTEMPT + "/outputs"  # GET -> {"files": [{"path", "size", "sha256"}]}
OUTPUT_FILE = ATTEMPT + "/outputs/{path:.+}"  # GET ?offset= -> the file's bytes from offset
COST = ATTEMPT + "/cost"  # POST {"offer": ...} -> Cost
EXECUTOR = ATTEMPT + "/executor"  # GET -> ExecutorIdentity
COMMITMENT = ATTEMPT + "/commitment"  # GET -> SignedCommitment
OPENINGS = ATTEMPT + "/openings"  # POST {"indices": [...]} -> {"files": [...]} (paths under the checkpoint dir)
OPENED_FILE = ATTEMPT + "/openings/{path:.+}"  # GET ?offset= -> the file's bytes from offset
CONCLUDE = ATTEMPT + "/conclude"  # POST Conclusion -> Acknowledgement (idempotent: the same countersignature)

RESUME_SCHEME = "attempt:"
"""A checkpoint reference: `attempt:<attempt id>`, the newest committed segment of that attempt here."""


class Answer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Submitted(Answer):
    attempt_id: str
    hotkey: str


class Metrics(Answer):
    data: str = Field(description="base64")
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    modified_at: float | None = None


class Checkpoint(Answer):
    uri: str | None = Field(None, min_length=1)


class Cancelled(Answer):
    stopped: int = Field(ge=0)


class Files(Answer):
    files: list[OutputFile]


def route(template: str, **values: str) -> str:
    """A route with its placeholders filled (`{path:.+}` by `path`)."""
    return template.replace("{path:.+}", "{path}").format(**values)


def encode(data: bytes) -> str:
    return base64.b64encode(data).decode()


def decode(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def safe_relative(path: str) -> bool:
    """Whether `path` names a file below a folder: relative, no `..`, no empty or dot parts."""
    parts = PurePosixPath(path).parts
    return bool(parts) and not PurePosixPath(path).is_absolute() and all(p not in ("", ".", "..") for p in parts) \
        and "\\" not in path and "\0" not in path

"""The miner protocol, version 1: what a broker and a trainmaster miner share, and all they share.

JSON over HTTP, every route under /v1, every request signed with the broker's hotkey (btauth/1, see
auth.py) for the miner's hotkey as receiver. Every statement of the miner the broker relies on is
signed with the miner's hotkey inside the answer (a quote, the commitment, the countersignature of a
conclusion): btauth signs requests only, never responses. docs/miner-protocol.md is the reference.

A refusal is a JSON body {"error": reason} with a 4xx status (401 authentication, 403 a caller the
miner does not serve, 404 no such attempt, 409 not yet / a conflicting resend, 413 too large, 422 not
valid); a 5xx is a fault that may pass. Files move as raw byte streams, their size and sha256 announced
in a manifest first; a download resumes with `Range: bytes=N-`.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainmaster.backends.base import OutputFile
from trainmaster.backends.features import LeafOpening

VERSION = 1
PREFIX = f"/v{VERSION}"

HELLO = f"{PREFIX}/hello"  # GET -> Hello
QUOTE = f"{PREFIX}/quote"  # POST QuoteRequest -> SignedQuote
BUNDLE = PREFIX + "/bundles/{sha256}"  # PUT the tar as the body -> {"sha256", "size"} (signed over an empty body)
ATTEMPTS = f"{PREFIX}/attempts"  # POST Dispatch -> Accepted (idempotent on attempt_id)
ATTEMPT = PREFIX + "/attempts/{attempt_id}"
STATUS = ATTEMPT + "/status"  # GET -> backends.base.AttemptStatus
LOGS = ATTEMPT + "/logs"  # GET ?offset= -> backends.base.LogChunk
METRICS = ATTEMPT + "/metrics"  # GET ?offset=&limit= -> Metrics
COMMITMENT = ATTEMPT + "/commitment"  # GET -> backends.features.SignedCommitment (409 until the run committed)
CHALLENGE = ATTEMPT + "/challenge"  # POST Challenge -> Files (paths under the checkpoint dir); 409 before commit
CHALLENGED_FILE = ATTEMPT + "/challenge/{path:.+}"  # GET (Range) -> the file's bytes
LEAVES = ATTEMPT + "/leaves"  # POST Leaves -> LeafOpenings (the refereed tier's bisection); 409 before commit
OUTPUTS = ATTEMPT + "/outputs"  # GET -> Files
OUTPUT_FILE = ATTEMPT + "/outputs/{path:.+}"  # GET (Range) -> the file's bytes
CANCEL = ATTEMPT + "/cancel"  # POST -> Cancelled
CONCLUDE = ATTEMPT + "/conclude"  # POST backends.features.Conclusion -> Acknowledgement (idempotent)

QUOTE_USED = "quote already used"
"""The reason of the 409 a dispatch on a quote that already bought an attempt gets (a quote buys one)."""

MAX_JSON_BYTES = 1 << 20
"""No JSON body either side sends is larger (a request above it gets 413; an answer above it is a fault)."""
MAX_FILES = 100_000
"""No manifest names more files."""
MAX_PATH_CHARS = 1024
QUOTE_KIND = "trainmaster-quote"
QUOTE_FORMAT = 1
HEX64 = re.compile(r"^[0-9a-f]{64}$")
SIGNATURE = re.compile(r"^0x[0-9a-f]{128}$")
ATTEMPT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hello(Message):
    protocol: int
    hotkey: str = Field(description="The miner's hotkey (ss58): what it signs with, and the receiver it accepts.")


class QuoteRequest(Message):
    """What the broker asks a price for: the job's spec (as JSON), its T steps, and the resources it needs."""

    spec: dict[str, Any]
    total_steps: int | None = Field(None, ge=1)


class Quote(Message):
    """The miner's price for this job's work, as it signs it (canonical JSON of these fields)."""

    kind: Literal["trainmaster-quote"] = QUOTE_KIND
    format: Literal[1] = QUOTE_FORMAT
    quote_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    miner: str = Field(description="The miner's hotkey (ss58).")
    broker: str = Field(description="The hotkey the quote was made for (ss58); no one else may dispatch on it.")
    spec_sha256: str = Field(pattern=HEX64.pattern, description="sha256 of the canonical JSON of the spec priced.")
    total_steps: int | None = Field(None, ge=1)
    gpu_type: str | None = None
    gpu_count: int = Field(0, ge=0)
    cpus: int = Field(1, ge=1)
    memory_mb: int | None = Field(None, ge=0)
    rao_per_hour: int = Field(ge=0)
    hours: float = Field(gt=0, description="The run time the price covers.")
    rao: int = Field(ge=0, description="The price of the job's whole work, paid once, only when accepted.")
    valid_until: int = Field(description="Unix time (s) after which the miner accepts no dispatch on it.")

    def canonical_json(self) -> bytes:
        return canonical(self.model_dump(mode="json"))


class SignedQuote(Message):
    quote: str = Field(max_length=8192, description="The quote's canonical JSON, exactly the signed bytes.")
    signature: str = Field(pattern=SIGNATURE.pattern)

    def parsed(self) -> Quote:
        """The quote; ValueError when the bytes are not its canonical JSON."""
        quote = Quote.model_validate_json(self.quote)
        if quote.canonical_json().decode() != self.quote:
            raise ValueError("the quote is not in canonical JSON")
        return quote


class Dispatch(Message):
    """Start an attempt. A resend with the same body gets the same answer; another body under the same
    attempt id is refused (409)."""

    attempt_id: str = Field(pattern=ATTEMPT_ID.pattern)
    job_id: str = Field(pattern=ATTEMPT_ID.pattern)
    spec: dict[str, Any]
    quote: SignedQuote
    bundle_sha256: str = Field(pattern=HEX64.pattern)
    seed: int = Field(ge=0, lt=2**63)
    challenge_digest: str = Field(pattern=HEX64.pattern,
                                  description="sha256 of the challenge secret the broker reveals at `conclude`.")


class Accepted(Message):
    attempt_id: str
    hotkey: str
    accepted_at: float


class Metrics(Message):
    data: str = Field(description="base64")
    offset: int = Field(ge=0)
    size: int = Field(ge=0)
    modified_at: float | None = None


class Challenge(Message):
    indices: list[int] = Field(min_length=1, max_length=4096)
    boundaries: bool = Field(True, description="Also open chunks of every boundary (the sampled tier); the "
                                                "refereed tier's opening of one agreed state does not need them.")


MAX_LEAVES = 64
"""No leaf opening names more leaves (a bisection asks for one or two at a time)."""


class Leaves(Message):
    """Open these leaves of the committed tree, each with its inclusion proof."""

    indices: list[int] = Field(min_length=1, max_length=MAX_LEAVES)


class LeafOpenings(Message):
    leaves: list[LeafOpening] = Field(max_length=MAX_LEAVES)


class Files(Message):
    files: list[OutputFile] = Field(max_length=MAX_FILES)

    @field_validator("files")
    @classmethod
    def _safe_paths(cls, files: list[OutputFile]) -> list[OutputFile]:
        seen = set()
        for f in files:
            if not safe_relative(f.path):
                raise ValueError(f"{f.path[:100]!r} is not a relative path below its folder")
            if not HEX64.fullmatch(f.sha256) or f.size < 0:
                raise ValueError(f"{f.path[:100]!r}: a size and a sha256 (lowercase hex) are announced")
            if f.path in seen:
                raise ValueError(f"{f.path[:100]!r} is announced twice")
            seen.add(f.path)
        return files


class Cancelled(Message):
    stopped: int = Field(ge=0)


def canonical(obj: Any) -> bytes:
    """The one byte form of a signed JSON statement."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def spec_sha256(spec: dict[str, Any]) -> str:
    import hashlib

    return hashlib.sha256(canonical(spec)).hexdigest()


def route(template: str, **values: str) -> str:
    """A route with its placeholders filled (`{path:.+}` by `path`)."""
    return template.replace("{path:.+}", "{path}").format(**values)


def safe_relative(path: str) -> bool:
    """Whether `path` names a file below a folder: relative, no `..`, no empty or dot parts, no
    backslash, NUL or control character, not too long."""
    if not path or len(path) > MAX_PATH_CHARS or any(ord(c) < 32 or c in "\\\x7f" for c in path):
        return False
    pure = PurePosixPath(path)
    return not pure.is_absolute() and not path.startswith("/") and all(p not in ("", ".", "..") for p in path.split("/"))

"""Driving the local backend directly (submit → status → fetch) with or without a sandbox, for tests/test_sandbox*.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import textwrap
import time
from pathlib import Path

from trainmaster.backends.base import AttemptContext, AttemptStatus, Handle, Offer
from trainmaster.backends.local.backend import LocalBackend
from trainmaster.backends.local.config import LocalConfig, Sandbox
from trainmaster.jobs.bundle import build_bundle
from trainmaster.jobs.spec import load_spec

_ids = itertools.count(1)


def backend(sandbox: Sandbox | None) -> LocalBackend:
    return LocalBackend(LocalConfig(sandbox=sandbox))


def submit(local: LocalBackend, root: Path, script: str, spec: str = "", entrypoint: str = "python train.py",
           files: dict[str, str] | None = None) -> Handle:
    """Bundle `script` as train.py (and `files`, by name) of a job under `root` and start it; the handle."""
    n = next(_ids)
    code = root / f"code{n}"
    code.mkdir(parents=True)
    (code / "train.py").write_text(textwrap.dedent(script))
    for name, text in (files or {}).items():
        (code / name).write_text(text)
    (code / "job.yaml").write_text(f"name: sandboxed\nentrypoint: {entrypoint}\n{textwrap.dedent(spec)}")
    loaded = load_spec(code / "job.yaml")
    info = build_bundle(loaded.code_dir, loaded.spec.canonical_json(), root / "bundles")
    offer = Offer(backend="local", instance="here", price_per_hour_micro_usd=1, trusted=True, detail={"nproc": 1})
    ctx = AttemptContext(job_id=f"sandboxed-{n}", attempt_id=f"sandboxed-{n}-1", bundle_sha256=info.sha256, seed=0,
                         workdir=str(root / "attempts" / str(n)))
    return asyncio.run(local.submit(info.path, loaded.spec, offer, ctx))


def wait(local: LocalBackend, handle: Handle, timeout: float = 120.0) -> AttemptStatus:
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = asyncio.run(local.status(handle))
        if st.phase.done:
            return st
        time.sleep(0.1)
    raise AssertionError(f"the job did not end within {timeout} s; log:\n{log(handle)}")


def fetch(local: LocalBackend, handle: Handle, dest: Path) -> dict[str, bytes]:
    asyncio.run(local.fetch(handle, dest))
    return {str(p.relative_to(dest)): p.read_bytes() for p in sorted(dest.rglob("*")) if p.is_file()}


def run(local: LocalBackend, root: Path, script: str, spec: str = "") -> tuple[AttemptStatus, dict, Handle]:
    """Submit, wait, fetch: (status, the job's `seen.json` output or {}, handle)."""
    handle = submit(local, root, script, spec)
    st = wait(local, handle)
    files = fetch(local, handle, root / f"fetched-{handle.attempt_id}")
    return st, json.loads(files.get("seen.json", b"{}")), handle


def log(handle: Handle) -> str:
    path = Path(handle.data["workdir"]) / "job.log"
    return path.read_text(errors="replace") if path.exists() else ""


def workdir(handle: Handle) -> Path:
    return Path(handle.data["workdir"])

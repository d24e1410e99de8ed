"""A spec's code as `submit` would send it, bundled and extracted afresh (its sha256 checked) into a scratch folder.

What the CLI runs of a job's own code on this machine (the evaluator of `verify DIR --spec`, the recipe that
`verify calibrate` measures in a child process) comes from here, never from the folder as it is now.
"""

from __future__ import annotations

from pathlib import Path


def fresh_code(loaded, scratch: Path) -> Path:
    """``scratch/code``: the spec's code bundled and extracted; raises ``BundleError``."""
    from trainmaster.jobs.bundle import build_bundle, extract_bundle

    info = build_bundle(loaded.code_dir, loaded.spec.canonical_json(), scratch, max_bytes=loaded.spec.limits.max_bundle_mb * 2**20)
    extract_bundle(info.path, scratch / "code", expected_sha256=info.sha256)
    return scratch / "code"

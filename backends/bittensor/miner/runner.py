"""The one place the miner builds the local backend that runs its attempts, and what it asks of it.

Every attempt runs in `<home>/jobs/<attempt id>/` (the local backend's work dir: code/, outputs/,
checkpoints/, job.log), in an AttemptContext carrying the broker's job id, seed and challenge digest, so
the runtime writes its commitment and segments exactly as for any other backend. Construction lives in
`local_backend` alone: confinement settings of the local backend (running jobs as another user) are
switched on there."""

from __future__ import annotations

from pathlib import Path

from trainmaster.backends.base import AttemptContext, Handle, Offer, OfferRequest
from trainmaster.backends.bittensor.protocol import Dispatch
from trainmaster.backends.local import LocalBackend, LocalConfig
from trainmaster.backends.local.config import Sandbox
from trainmaster.jobs.spec import JobSpec


def local_backend(config: LocalConfig, *, confine: bool, hide: list[Path]) -> LocalBackend:
    """The backend every attempt of this miner runs on: with `confine`, each job is its own unprivileged user
    that sees none of `hide` (the miner's home but its own folder, the wallet) nor other jobs."""
    if confine:
        sandbox = config.sandbox or Sandbox()
        hidden = sorted({*sandbox.hide, *(str(p.resolve()) for p in hide)})
        config = config.model_copy(update={"sandbox": sandbox.model_copy(update={"hide": hidden})})
    return LocalBackend(config)


async def offer_for(local: LocalBackend, spec: JobSpec) -> tuple[Offer | None, list[str]]:
    """The local backend's offer for `spec` on the miner's inventory, or None and why it cannot run it."""
    found = await local.offers(OfferRequest(spec=spec))
    return (found.offers[0] if found.offers else None), found.reasons


def workdir(home: Path, attempt_id: str) -> Path:
    return home / "jobs" / attempt_id


def bundle_path(home: Path, sha256: str) -> Path:
    return home / "bundles" / f"{sha256}.tar"


def context(home: Path, dispatch: Dispatch) -> AttemptContext:
    return AttemptContext(job_id=dispatch.job_id, attempt_id=dispatch.attempt_id, bundle_sha256=dispatch.bundle_sha256,
                          seed=dispatch.seed, workdir=str(workdir(home, dispatch.attempt_id)),
                          challenge_digest=dispatch.challenge_digest)


async def start(local: LocalBackend, home: Path, dispatch: Dispatch, spec: JobSpec, offer: Offer) -> Handle:
    """Start the attempt (or find it started: the local backend never starts an attempt twice)."""
    return await local.submit(bundle_path(home, dispatch.bundle_sha256), spec, offer, context(home, dispatch))

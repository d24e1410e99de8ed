"""The refereed tier's one replay (docs/protocol.md §3c), run in the audit pool's worker process.

Given the dispute (verify/referee.py ``Dispute``) and the agreed state as one executor opened it (a checkpoint
folder, as ``open_segments`` lays it out), this re-executes the one segment in the runtime's deterministic mode
on this machine and returns the digests to compare each side's leaf with:

* ``initial``: the broker's own S_0 (built from the spec's recipe and the pair's seed): its weights and rest
  digests;
* ``state``: the agreed S_{j−1} and trace of segment j − 1 are tied to leaf j − 1 of the opened side's root
  (``verify.openings.open_checked``, sizes bounded by the job's layout, parsed strictly), then segment j − 1 is
  replayed following that agreed trace: S_j's weights and rest digests;
* ``trace``: the agreed S_j is tied to leaf j, then segment j is replayed deciding for itself: its trace's digest.

Bit for bit is what the comparison needs, so the replay runs on the device kind the executors' commitments name
and reports this machine's fingerprint (``jobs.devices.fingerprint``); the caller compares it with theirs.
Whose fault a failure is: an opening that does not match the opened side's root is that side's (``forfeit``);
anything else (no recipe to replay, no such device here) is ours (``cannot_verify``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import VerificationError


@dataclass(frozen=True)
class DisputeReplay:
    """What the worker needs: the job's spec (JSON), the pair's seed, the dispute, the opened side's commitment
    bytes and where its opening of the agreed state lies (None for ``initial``)."""

    spec_json: str
    seed: int
    compared: str
    segment: int | None
    opened_state: int | None
    commitment: bytes | None = None
    openings_dir: str | None = None
    device: str = "cpu"


def replay_dispute(request: DisputeReplay) -> dict[str, Any]:
    """The replay's digests and this verifier's fingerprint, or ``{"failed": reason, "blame": "opened"|"ours"}``."""
    try:
        return _replay(request)
    except _Blame as exc:
        return {"failed": exc.reason, "blame": exc.blame}
    except VerificationError as exc:
        return {"failed": exc.reason, "blame": "ours"}
    except Exception as exc:  # noqa: BLE001 — a replay that cannot run settles nothing: ours, never an executor's
        return {"failed": f"the replay failed to run: {type(exc).__name__}: {exc}", "blame": "ours"}


class _Blame(Exception):
    def __init__(self, reason: str, blame: str):
        super().__init__(reason)
        self.reason, self.blame = reason, blame


def _replay(request: DisputeReplay) -> dict[str, Any]:
    import torch

    from trainmaster.jobs.canonical import views
    from trainmaster.jobs.chunks import file_digest
    from trainmaster.jobs.devices import DeviceError, fingerprint, replaying_on
    from trainmaster.jobs.execution import build_trainer, full_state
    from trainmaster.jobs.spec import JobSpec

    from .recipe_run import recipe_run

    spec = JobSpec.model_validate_json(request.spec_json)
    if spec.bundle_recipe is not None:
        raise _Blame("the job's own recipe (a module of its bundle) is not refereed in this version: "
                     "only shipped runtime recipes are replayed in the broker's process", "ours")
    run = recipe_run(spec)
    threads = torch.get_num_threads()
    try:
        with replaying_on(request.device):
            cfg = run.recipe.config(run.config)
            initial = full_state(build_trainer(run.recipe, cfg, request.seed), run.recipe, cfg, request.seed, 0).on_host()
            found: dict[str, Any] = {"verifier": fingerprint(request.device)}
            if request.compared == "initial":
                found.update(weights=file_digest(views(initial.weights)), rest=file_digest(views(initial.rest)))
                return found
            opening = _open(request, run.recipe, cfg, initial, run.k)
            forced = opening.trace if request.compared == "state" else None
            from trainmaster.jobs.replay import replay_state

            result = replay_state(run.recipe, opening.state, run.k, forced, run.config)
            if request.compared == "state":
                found.update(weights=result.weights_sha256, rest=result.state_rest_sha256)
            else:
                found.update(trace=file_digest(views(result.trace.to_tensors())))
            return found
    except DeviceError as exc:
        raise _Blame(f"the replay cannot run on {request.device} here: {exc}", "ours") from None
    finally:
        torch.set_num_threads(threads)


def _open(request: DisputeReplay, recipe, cfg, initial, k: int):
    """The agreed state, tied to the opened side's root (its fault when it is not)."""
    from trainmaster.jobs.commitment import Commitment, CommitmentError

    from .openings import LocalOpenings, OpeningError, OpeningLimits, open_checked

    try:
        commitment = Commitment.from_json(request.commitment or b"")
    except CommitmentError as exc:
        raise _Blame(f"the opened side's commitment does not parse: {exc}", "ours") from None
    limits = OpeningLimits.for_job(recipe, cfg, initial, k)
    try:
        return open_checked(LocalOpenings(Path(request.openings_dir or "")), commitment, int(request.opened_state),
                            limits)
    except OpeningError as exc:
        raise _Blame(f"its opening of the agreed S_{request.opened_state}: {exc.reason}", "opened") from None

"""Which device the broker re-executes a challenged segment on, and which calibration applies.

The executor's device kind is in its signed commitment (``device``: ``cuda``, absent for the CPU).
The verifier replays where it can (docs/audit.md, "Devices"):

* a **trusted deterministic** executor (our own local backend) is replayed bit for bit on the same
  kind of device it trained on: a run trained on a GPU needs a GPU here (it is this machine's own);
* otherwise on a **GPU** when this process has one and the job class is calibrated for
  (executor, cuda); else on the **CPU**, with the (executor, cpu) calibration — for a GPU executor the
  class's cpu→cpu calibration stands in when no cuda→cpu one was measured
  (:func:`trainmaster.verify.calibration.calibration_for_pair`);
* with an explicit τ, on the executor's kind of device when this process has it, else the CPU.

``TRAINMASTER_AUDIT_DEVICE`` (``auto``, the default, ``cpu`` or ``cuda``) makes the broker replay on
one kind only, e.g. to keep its GPUs for training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .calibration import Calibration, UncalibratedError, calibration_for_pair, has_calibration, pair_name

AUDIT_DEVICE_ENV = "TRAINMASTER_AUDIT_DEVICE"
CHOICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class VerifierChoice:
    """Where the audit replays, and with what."""

    device: str
    """The verifier's device kind: ``cpu`` or ``cuda``."""
    executor: str
    calibration: Calibration | None = None

    @property
    def pair(self) -> str:
        return pair_name(self.executor, self.device)

    @property
    def note(self) -> str | None:
        """Said in the verdict when the calibration is not the pair's own."""
        if self.calibration is None or self.calibration.pair == self.pair:
            return None
        return f"the {self.calibration.pair} calibration stands in for {self.pair} (docs/audit.md, Devices)"


def wanted_device(env: dict[str, str] | None = None) -> str:
    """``TRAINMASTER_AUDIT_DEVICE`` (``auto`` when unset); a value not in :data:`CHOICES` cannot verify."""
    value = (os.environ if env is None else env).get(AUDIT_DEVICE_ENV, "").strip().lower() or "auto"
    if value not in CHOICES:
        raise UncalibratedError(f"{AUDIT_DEVICE_ENV}={value!r} is not one of {', '.join(CHOICES)}")
    return value


def cuda_here() -> bool:
    from trainmaster.jobs.devices import cuda_available

    return cuda_available()


def choose(
    executor: str,
    job_class: str,
    *,
    calibration_dir: Path | None,
    tau: float | None = None,
    exact: bool = False,
    wanted: str | None = None,
) -> VerifierChoice:
    """Where to replay a run trained on ``executor`` (see the module docstring); :class:`UncalibratedError`
    when no device here can audit it."""
    wanted = wanted or wanted_device()
    gpu = cuda_here() and wanted in ("auto", "cuda")
    if wanted == "cuda" and not cuda_here():
        raise UncalibratedError(f"{AUDIT_DEVICE_ENV}=cuda, but this process sees no CUDA device")
    if exact:
        if executor == "cuda" and not gpu:
            raise UncalibratedError(
                "a trusted deterministic executor trained on cuda is replayed bit for bit on a GPU, and this process "
                "has none it may use for audits"
            )
        return VerifierChoice(executor, executor)
    if tau is not None:
        return VerifierChoice("cuda" if executor == "cuda" and gpu else "cpu", executor)
    if gpu and has_calibration(calibration_dir, job_class, executor, "cuda"):
        return VerifierChoice("cuda", executor, calibration_for_pair(calibration_dir, job_class, executor, "cuda"))
    if wanted == "cuda":
        raise UncalibratedError(
            f"{AUDIT_DEVICE_ENV}=cuda, but job class {job_class} is not calibrated for {pair_name(executor, 'cuda')}"
        )
    if not has_calibration(calibration_dir, job_class, executor, "cpu") and not (
        executor == "cuda" and has_calibration(calibration_dir, job_class, "cpu", "cpu")
    ):
        return VerifierChoice("cpu", executor)  # none at all: the audit says the class is uncalibrated
    return VerifierChoice("cpu", executor, calibration_for_pair(calibration_dir, job_class, executor, "cpu"))

"""Which S_0 an executor's opened S_0 must equal, bit for bit: the one the spec's recipe and seed produce with the CPU
kernel set its signed commitment names (docs/audit.md, "Kernel sets"; docs/protocol.md §4).

torch picks its CPU kernels at start-up by the CPU's capability (``DEFAULT``, ``AVX2``, ``AVX512``, …; a process may
choose a lower one with ``ATEN_CPU_CAPABILITY``), and the vectorized kernels draw other bits than the portable ones
(``normal_`` of ≥ 16 elements, so every initialiser built on it): an honest executor on another CPU builds another W0
from the same recipe and seed. The runtime's commitment records the kernel set it computed with
(``deterministic``: ``torch …; cpu DEFAULT``, jobs/devices.py ``fingerprint``), signed before the challenge. So:

* the commitment names no CPU kernel set (a GPU run's fingerprint from before it did, or none), or this process's own
  (a GPU run's names the kernel set of the CPU that drew its W0): S_0 is the one
  the audit built in process (``rebuilt: here``);
* it names another: S_0 is rebuilt in a child process started with ``ATEN_CPU_CAPABILITY`` set to that kernel set
  (:mod:`trainmaster.verify.initial_child`) and compared bit for bit (``rebuilt: child``). The executor's choice of
  claim buys it nothing: whatever it names, the S_0 it must match is the one W0 that kernel set's recipe produces;
* the child cannot select that kernel set (this CPU lacks it: an AVX-512 miner audited on an AVX2 machine), cannot
  run, or the name is no kernel set torch knows: S_0 is **not judged here** (``matched: None``), never accepted
  silently. The audit still runs every other check, and any of them failing rejects as before; if all pass, the
  verification cannot be completed here (``cannot_verify``: unpaid, unbanned, `verify show --again` on a machine
  whose CPU has that kernel set settles it), as the refereed tier does with bits it cannot replay.

The segment replays themselves run with this machine's kernels: their difference from the executor's is an honest
perturbation of a few ulps per step, judged by the calibrated τ(k) like any other (docs/audit.md, "Kernel sets").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.devices import cpu_capability, fingerprint_cpu_kernels

from .evidence import InitialStateEvidence

KERNELS_ENV = "ATEN_CPU_CAPABILITY"
MODULE = "trainmaster.verify.initial_child"
TIMEOUT_S = 1800.0
"""Building a model's initial state: seconds for the shipped recipes; generous for a large job's own."""
MAX_ANSWER_BYTES = 4096


def claimed_kernels(commitment: Commitment) -> str | None:
    """The CPU kernel set the executor's commitment says its run's W0 was drawn with (a GPU run's W0 is initialised
    on the CPU too: its fingerprint names that set last); None when it names none."""
    return fingerprint_cpu_kernels(commitment.deterministic)


def expected_initial(commitment: Commitment, *, weights_sha256: str, rest_sha256: str, recipe: str | None,
                     config: dict, seed: int, device: str | None) -> InitialStateEvidence:
    """The S_0 digests the executor's S_0 must have (``weights_sha256``/``rest_sha256``: the verifier's own S_0,
    built in process), and how they were found; ``recipe`` names what the child builds (a shipped recipe's name or
    a job's ``module:attr``; None: none the child can import, so another kernel set's S_0 is not judged here)."""
    here = cpu_capability()
    claimed = claimed_kernels(commitment)
    if claimed is None or claimed == here:
        return InitialStateEvidence(kernels=claimed, verifier_kernels=here, rebuilt="here",
                                    weights_sha256=weights_sha256, rest_sha256=rest_sha256)
    evidence = InitialStateEvidence(kernels=claimed, verifier_kernels=here, rebuilt="child")
    if recipe is None:
        return evidence.not_judged(f"S_0 was built with the CPU kernel set {claimed} (the commitment's "
                                   f"{commitment.deterministic!r}) and this audit has no recipe a child process can "
                                   f"rebuild it with")
    try:
        built = rebuild(recipe, config, seed, claimed, device)
    except RebuildError as exc:
        return evidence.not_judged(exc.reason)
    return evidence.model_copy(update={"weights_sha256": built["weights_sha256"], "rest_sha256": built["rest_sha256"]})


class RebuildError(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def rebuild(recipe: str, config: dict, seed: int, kernels: str, device: str | None = None,
            timeout_s: float = TIMEOUT_S) -> dict[str, str]:
    """S_0's digests as a process running with the CPU kernel set ``kernels`` builds it; :class:`RebuildError`
    (saying why) when this machine cannot select that kernel set or the child gives no answer."""
    unjudged = f"S_0 was built with the CPU kernel set {kernels}, and this verifier"
    request = json.dumps({"recipe": recipe, "config": config, "seed": seed, "device": device})
    env = {**os.environ, KERNELS_ENV: kernels.lower()}
    with tempfile.TemporaryDirectory(prefix="trainmaster-initial-") as tmp:
        answer = Path(tmp) / "answer.json"
        try:
            done = subprocess.run([sys.executable, "-m", MODULE, str(answer)], input=request.encode(), env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise RebuildError(f"{unjudged} could not rebuild it within {timeout_s:.0f} s") from None
        except OSError as exc:
            raise RebuildError(f"{unjudged} could not start a process to rebuild it: {exc}") from None
        if done.returncode != 0 or not answer.is_file():
            last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1][-300:]
            raise RebuildError(f"{unjudged} failed to rebuild it (exit {done.returncode}: {last})")
        try:
            built = json.loads(answer.read_bytes()[:MAX_ANSWER_BYTES])
        except ValueError as exc:
            raise RebuildError(f"{unjudged} read no answer from its rebuild: {exc}") from None
    if built.get("kernels") != kernels:
        raise RebuildError(f"{unjudged}'s CPU cannot select it (torch picks {built.get('kernels')} here): S_0 is "
                           f"judged on a machine that can (`trainmaster verify show JOB --again` there)")
    return built

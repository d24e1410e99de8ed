"""The outcome check: is the final model good enough? (docs/protocol.md §7)

Metrics come from, in order of preference:

1. an evaluation function (``checkpoint path -> {metric: value}``) passed in by the caller;
2. the spec's ``verification.evaluator``: a command in the bundle, run on the broker in a
   subprocess with ``TRAINMASTER_EVAL_CHECKPOINT`` set to the final checkpoint, whose last
   non-empty stdout line is a JSON object of metrics. It runs in the job's environment: the
   interpreter the job ran with (its virtualenv first on ``PATH``; ``python`` names it), the spec's
   ``env``, and its words expanded as the entrypoint's are (``jobs.environment.expand_command``);
3. the run's own ``result.json`` — self-reported, so only from outputs judged as trusted compute's
   (``trust_reported``): from an untrusted executor, or a folder of unknown origin, thresholds without an
   evaluator give ``cannot_verify``, never acceptance.

The evaluator's working directory (``code_dir``) is the caller's fresh, hash-checked extraction of the
bundle, never a directory the job could have written (verify/pipeline.py).

Each ``verification.thresholds`` entry ``{metric: minimum}`` must hold. With the previous accepted
metrics given, no metric named in the thresholds may fall more than 10 % below its previous value
(``value ≥ previous − 0.10·|previous|``, which is ``0.90 × previous`` for positive values).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from trainmaster.jobs.environment import expand_command, interpreter_environment
from trainmaster.jobs.inherited import inherited
from trainmaster.jobs.files import HostileFile, read_regular
from trainmaster.jobs.spec import PYTHON_NAMES

from .errors import VerificationError

CHECKPOINT_ENV = "TRAINMASTER_EVAL_CHECKPOINT"
REGRESSION_FLOOR = 0.90
RESULT_FILE = "result.json"
MAX_RESULT_BYTES = 16 * 2**20
"""A result.json holds summary figures (the runtime writes a few hundred bytes); a script's own may
hold more, never gigabytes. Checked before it is read."""
OUTPUT_TAIL = 4000

Evaluate = Callable[[Path], Mapping[str, float]]


class OutcomeResult(BaseModel):
    model_config = ConfigDict(frozen=True)
    passed: bool
    source: str
    metrics: dict[str, float]
    failures: list[str] = Field(default_factory=list)
    output: str = ""


def check_outcome(
    checkpoint: Path,
    *,
    thresholds: Mapping[str, float],
    evaluator: str | None = None,
    code_dir: Path | None = None,
    evaluate: Evaluate | None = None,
    outputs: Path | None = None,
    trust_reported: bool = False,
    previous: Mapping[str, float] | None = None,
    timeout_s: float = 3600.0,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> OutcomeResult:
    """Evaluate the final model and compare its metrics with the thresholds and the previous model.

    With no thresholds, no evaluator and no evaluation function there is nothing to check, and the
    result passes with source ``none``. Raises :class:`VerificationError` (``cannot_verify``) when
    metrics are needed but cannot be obtained. ``python``: the interpreter the job ran with (default:
    the broker's); ``env``: the spec's own variables, for the evaluator.
    """
    if evaluate is not None:
        metrics, source, output = _numbers(evaluate(Path(checkpoint))), "function", ""
    elif evaluator:
        metrics, output = run_evaluator(evaluator, Path(checkpoint), cwd=code_dir, timeout_s=timeout_s,
                                        python=python, env=env)
        source = "evaluator"
    elif thresholds:
        metrics, source, output = _reported(outputs, trust_reported), RESULT_FILE, ""
    else:
        return OutcomeResult(passed=True, source="none", metrics={})
    failures = threshold_failures(metrics, thresholds) + regression_failures(metrics, thresholds, previous)
    return OutcomeResult(passed=not failures, source=source, metrics=metrics, failures=failures, output=output)


def run_evaluator(command: str, checkpoint: Path, *, cwd: Path | None, timeout_s: float, python: str | None = None,
                  env: Mapping[str, str] | None = None) -> tuple[dict[str, float], str]:
    """Run the evaluator command in the job's environment; return its metrics and the tail of its output."""
    python = python or sys.executable
    # the evaluator is the job's code: it gets what a job inherits (jobs/inherited.py), never the broker's secrets
    env = interpreter_environment(python, {**inherited(os.environ), **(env or {}),
                                           CHECKPOINT_ENV: str(Path(checkpoint).absolute())})
    argv = expand_command(command, env)
    if argv and argv[0] in PYTHON_NAMES:
        argv[0] = python
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VerificationError(f"the evaluator {command!r} could not run: {exc}", kind="cannot_verify") from exc
    tail = (done.stdout + done.stderr)[-OUTPUT_TAIL:]
    if done.returncode != 0:
        raise VerificationError(
            f"the evaluator {command!r} exited with status {done.returncode}: {_last_line(done.stderr) or _last_line(done.stdout)}",
            kind="cannot_verify",
        )
    return parse_metrics_line(done.stdout, command), tail


def parse_metrics_line(stdout: str, command: str) -> dict[str, float]:
    """The metrics on the last non-empty line of ``stdout`` (a JSON object)."""
    line = _last_line(stdout)
    try:
        value = json.loads(line)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise VerificationError(
            f"the evaluator {command!r} did not end its output with a JSON object of metrics (last line: {line[:200]!r})",
            kind="cannot_verify",
        )
    return _numbers(value)


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics (bools and non-numbers are left out); a non-finite number stays, and fails."""
    return {str(k): _float(v) for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _float(value: int | float) -> float:
    """A reported number as a float; an int past float's range (10**400) is ±Inf, which fails its threshold."""
    return float(value) if isinstance(value, float) or abs(value) < 2**1024 else math.copysign(math.inf, value)


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _reported(outputs: Path | None, trusted: bool) -> dict[str, float]:
    if not trusted:
        raise VerificationError(
            f"thresholds are set but no evaluator is: self-reported metrics from untrusted outputs are not "
            f"evidence (their {RESULT_FILE} and metrics.jsonl are the run's own claims); give the spec an evaluator "
            "(verification.evaluator)",
            kind="cannot_verify",
        )
    path = Path(outputs or ".") / RESULT_FILE
    try:
        value = json.loads(read_regular(path, MAX_RESULT_BYTES, RESULT_FILE).decode("utf-8"))
    except HostileFile as exc:  # a link, a FIFO, a 3 GB file: the executor's doing
        raise VerificationError(f"thresholds are set but {exc}") from None
    except (OSError, ValueError) as exc:
        raise VerificationError(f"thresholds are set but {path} is unreadable: {exc}", kind="cannot_verify") from exc
    if not isinstance(value, dict):
        raise VerificationError(f"{path} is not a JSON object", kind="cannot_verify")
    return _numbers(value)


def threshold_failures(metrics: Mapping[str, float], thresholds: Mapping[str, float]) -> list[str]:
    failures = []
    for name, minimum in sorted(thresholds.items()):
        if name not in metrics:
            raise VerificationError(f"metric {name!r} is not among the reported metrics {sorted(metrics)}", kind="cannot_verify")
        value = metrics[name]
        if not math.isfinite(value) or value < minimum:
            failures.append(f"{name} = {value:.6g} is below the threshold {minimum:.6g}")
    return failures


def regression_failures(
    metrics: Mapping[str, float], thresholds: Mapping[str, float], previous: Mapping[str, float] | None
) -> list[str]:
    """Metrics named in the thresholds that fell more than 10 % below the previous accepted value."""
    failures = []
    for name in sorted(thresholds):
        if previous is None or name not in previous or name not in metrics:
            continue
        floor = previous[name] - (1 - REGRESSION_FLOOR) * abs(previous[name])
        if not metrics[name] >= floor:
            failures.append(
                f"{name} = {metrics[name]:.6g} regressed below {REGRESSION_FLOOR:.0%} of the previous accepted "
                f"{previous[name]:.6g} (floor {floor:.6g})"
            )
    return failures

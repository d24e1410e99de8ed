"""Re-execute one segment from its state S_i: the verifier's entry point.

``replay_segment`` loads S_i (``weights.safetensors`` + ``rest.safetensors``, strictly canonical),
rebuilds the trainer from the recipe and config the state records, runs k steps and returns the
state it reaches. With ``forced_decisions`` it follows the executor's decision trace and reports
where its own values would have chosen otherwise.

CLI (exit 0: replayed; 1: the state or trace is bad; 2: usage)::

    python -m trainmaster.jobs.replay SEGMENT_DIR --k 25 --out OUT_DIR \\
        [--recipe dqn] [--config config.json] [--force-decisions [TRACE]]

writes ``OUT_DIR/{weights,rest,decisions}.safetensors`` (canonical) and ``OUT_DIR/report.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .canonical import serialize, views
from .chunks import file_digest
from .checkpoint import DECISIONS, REST, WEIGHTS, CheckpointError, read_canonical_file, write_bytes_atomic
from .decisions import DecisionLog, DecisionReport, DecisionTrace, DecisionTraceError
from .execution import StateError, build_trainer, full_state, restore, run_step, state_info
from .recipe import Recipe
from .state import TrainState
from .state_diff import describe, differing
from .step_rates import recording_step_rates

REPORT_FILE = "report.json"


@dataclass(frozen=True)
class ReplayResult:
    """The outcome of re-executing steps ``start_step .. end_step - 1``."""

    start_step: int
    end_step: int
    state: TrainState
    trace: DecisionTrace
    decisions: DecisionReport
    peak_lr: float | None = None
    """The largest learning rate any optimizer step of the re-execution used (None: no torch optimizer stepped)."""

    @property
    def weights(self) -> dict:
        return self.state.weights

    @property
    def weights_sha256(self) -> str:
        """The chunk digest of the canonical weights (``jobs/chunks.py``): compare with the committed
        ``weights_sha256`` of S_{i+1}."""
        return file_digest(views(self.state.weights))

    @property
    def state_rest_sha256(self) -> str:
        """The chunk digest of the canonical rest of S_{i+1} (its ``rest.safetensors``, without any trace)."""
        return file_digest(views(self.state.rest))

    def report(self) -> dict[str, Any]:
        return {
            "start_step": self.start_step,
            "end_step": self.end_step,
            "weights_sha256": self.weights_sha256,
            "rest_sha256": self.state_rest_sha256,
            "decisions": asdict(self.decisions),
        }


def load_state(state_path: Path) -> TrainState:
    """S_i from a segment directory's ``weights.safetensors`` and ``rest.safetensors``."""
    state_path = Path(state_path)
    return TrainState(weights=read_canonical_file(state_path / WEIGHTS), rest=read_canonical_file(state_path / REST))


def load_trace(path: Path) -> DecisionTrace:
    """A decision trace from a ``decisions.safetensors`` file (or a segment directory holding one)."""
    path = Path(path)
    return DecisionTrace.from_tensors(read_canonical_file(path / DECISIONS if path.is_dir() else path))


def replay_segment(
    recipe: str | Recipe | None,
    state_path: Path,
    k: int,
    forced_decisions: DecisionTrace | Path | None = None,
    config: Mapping[str, Any] | None = None,
) -> ReplayResult:
    """Load S_i from ``state_path``, run ``k`` steps, return S_{i+1} as this process computes it.

    ``recipe`` (a name or a :class:`Recipe`) and ``config`` are what the job spec says; when given,
    the state must record the same (else :class:`StateError`). ``None`` takes them from the state.
    """
    if isinstance(forced_decisions, str | Path):
        forced_decisions = load_trace(Path(forced_decisions))
    return replay_state(recipe, load_state(state_path), k, forced_decisions, config)


def replay_state(
    recipe: str | Recipe | None,
    state: TrainState,
    k: int,
    forced_decisions: DecisionTrace | None = None,
    config: Mapping[str, Any] | None = None,
) -> ReplayResult:
    """:func:`replay_segment` from a state already in memory (the verifier holds S_i once its opening
    is checked, and a write-and-read round trip would cost a third of its per-segment time).

    The trainer computes on the device its recipe resolves (``jobs/devices.py``: the verifier's, inside
    ``replaying_on``); S_i is loaded into it from the host, and the result's state is a host copy, so
    whatever compares it never mixes devices."""
    info = state_info(state)
    resolved = _resolve_recipe(recipe, info.recipe)
    if config is not None and dict(config) != info.config:
        raise StateError(f"the state's config {info.config} is not the expected {dict(config)}")
    try:
        cfg = resolved.config(info.config)
    except ValidationError as exc:
        raise StateError(f"the state's config is not a valid {resolved.name} config: {exc}") from exc
    if k < 1 or info.step + k > cfg.steps:
        raise StateError(f"cannot replay {k} steps from step {info.step} of a {cfg.steps}-step run")
    trainer = build_trainer(resolved, cfg, info.seed)
    restore(trainer, state)
    _check_loaded_unchanged(state.on_host(), full_state(trainer, resolved, cfg, info.seed, info.step).on_host())
    decisions = DecisionLog(forced=forced_decisions)
    with recording_step_rates() as rates:
        for step in range(info.step, info.step + k):
            run_step(trainer, info.seed, step, decisions)
    decisions.check_complete()
    end = full_state(trainer, resolved, cfg, info.seed, info.step + k).on_host()  # a GPU trainer's, copied to the host
    return ReplayResult(info.step, info.step + k, end, decisions.trace, decisions.report(), rates.peak)


def _check_loaded_unchanged(state: TrainState, loaded: TrainState) -> None:
    """S_i must be exactly what the spec's trainer holds after loading it.

    The trainer is built from the spec's config, so its hyperparameters (the optimizer's param
    groups among them) are the spec's whatever the state says; an entry the trainer does not
    read back, a dtype or shape it converts, or a stored hyperparameter that differs from the
    spec's shows up here as a difference, and the state is refused, naming the entry.
    """
    for part, found, expected in (("weights", state.weights, loaded.weights), ("rest", state.rest, loaded.rest)):
        if names := differing(found, expected):
            shown = "; ".join(describe(name, found, expected) for name in names[:3])
            more = f" (and {len(names) - 3} more)" if len(names) > 3 else ""
            raise StateError(f"the state's {part} are not what the spec's trainer loads from them: {shown}{more}")


def _resolve_recipe(recipe: str | Recipe | None, recorded: str) -> Recipe:
    from .recipes import get_recipe  # the registry imports torch-heavy recipe modules on demand

    resolved = get_recipe(recorded if recipe is None else recipe) if not isinstance(recipe, Recipe) else recipe
    if resolved.name != recorded:
        raise StateError(f"the state was trained by recipe {recorded!r}, not {resolved.name!r}")
    return resolved


def write_result(result: ReplayResult, out: Path) -> dict[str, Any]:
    """Write a replay's state, trace and report under ``out``; return the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {WEIGHTS: result.state.weights, REST: result.state.rest, DECISIONS: result.trace.to_tensors()}
    for name, tensors in files.items():
        write_bytes_atomic(out / name, serialize(tensors))
    report = result.report()
    write_bytes_atomic(out / REPORT_FILE, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainmaster.jobs.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("state", type=Path, help="segment directory holding weights.safetensors and rest.safetensors")
    parser.add_argument("--k", type=int, required=True, help="steps to re-execute (the spec's segment length)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the resulting state and report")
    parser.add_argument("--recipe", help="expected recipe name (default: the one the state records)")
    parser.add_argument("--config", type=Path, help="JSON file with the expected recipe config")
    parser.add_argument(
        "--force-decisions", nargs="?", const="", default=None, metavar="TRACE",
        help="follow a decision trace: the segment's own decisions.safetensors, or the file given",
    )
    args = parser.parse_args(argv)
    forced = None if args.force_decisions is None else Path(args.force_decisions or args.state)
    try:
        config = json.loads(args.config.read_text()) if args.config else None
        result = replay_segment(args.recipe, args.state, args.k, forced, config)
        report = write_result(result, args.out)
    except (CheckpointError, StateError, DecisionTraceError) as exc:
        print(f"replay failed: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"replay could not run: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

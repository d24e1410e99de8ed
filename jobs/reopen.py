"""Re-make the segments a run hashed but did not keep, to open them: re-run from the nearest kept state.

With ``checkpoint.keep_every: m`` the runtime keeps S_0, every m-th state, S_{n−1} and S_n, and of
the others writes only the manifest (their leaf). To open a challenged state it did not keep, the
executor runs this: from the nearest kept S_j below it, the recipe re-executes the segments up to it
(the same code, seed and device, so bit for bit what the run did), and at every boundary b it
passes, the digests of S_b and of segment b's trace must give the committed leaf ``h_b``; a wanted
segment is written back (its files, its manifest marked kept) only once its leaf matched. A state
that does not reproduce is never opened: :class:`ReopenError` says which leaf differed. The cost —
at most m·k steps per opened state — is the executor's, paid in its time to answer the challenge.

Command line (run by the executor's backend, with the job's interpreter)::

    python -m trainmaster.jobs.reopen CHECKPOINT_DIR --segments 3,4,17

reads ``CHECKPOINT_DIR/reopen.json`` (written by the runtime when it drops states: how a fresh
process imports the recipe) and re-makes the listed segments that are not on disk. Exit 0: done; 1:
a state did not reproduce, or the recipe could not be imported (the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from .canonical import serialize
from .checkpoint import (
    REST,
    WEIGHTS,
    CheckpointError,
    kept_indices,
    read_manifest,
    read_segment,
    rest_of,
    leaf_of,
    segment_dir,
    write_segment_bytes,
)
from .chunks import file_digest
from .decisions import DecisionLog, DecisionTrace
from .execution import build_trainer, full_state, restore, run_step, state_info
from .recipe import Recipe

LOCATION_FILE = "reopen.json"
"""In the checkpoint directory: ``{"attr", "module" | "script", "path": [...]}``, how to import the recipe."""


class ReopenError(CheckpointError):
    """A state that was not kept cannot be re-made as committed."""


def needed(indices: Iterable[int]) -> set[int]:
    """The states an opening of segments ``indices`` reads: S_i and S_{i+1} for each."""
    return {j for i in indices for j in (i, i + 1)}


def missing(checkpoint_dir: Path, indices: Iterable[int]) -> list[int]:
    """The states the openings of segments ``indices`` need that are not on disk (their manifest says not kept)."""
    out = []
    for j in sorted(needed(indices)):
        directory = segment_dir(checkpoint_dir, j)
        if (directory / "manifest.json").is_file() and not (directory / WEIGHTS).is_file():
            out.append(j)
    return out


def reopen(recipe: Recipe, checkpoint_dir: Path, wanted: Iterable[int]) -> list[int]:
    """Re-make the segments ``wanted`` that are not kept; returns those written. Raises :class:`ReopenError`."""
    checkpoint_dir = Path(checkpoint_dir)
    todo = sorted(set(wanted) - set(kept_indices(checkpoint_dir)))
    kept = kept_indices(checkpoint_dir)
    written: list[int] = []
    while todo:
        target = todo[0]
        bases = [j for j in kept if j < target]
        if not bases:
            raise ReopenError(f"no kept state below segment {target} to re-run from")
        base = bases[-1]
        group = [t for t in todo if base < t and not any(base < j < t for j in kept if j != base)]
        written += _rerun(recipe, checkpoint_dir, base, group)
        todo = [t for t in todo if t not in group]
    return written


def _rerun(recipe: Recipe, checkpoint_dir: Path, base: int, targets: Sequence[int]) -> list[int]:
    """From kept S_base, re-execute segment by segment up to the last target, checking every leaf."""
    loaded = read_segment(segment_dir(checkpoint_dir, base))
    info = state_info(loaded.state, world_size=None)
    config = recipe.config(info.config)
    k = loaded.manifest.k
    trainer = build_trainer(recipe, config, info.seed)
    restore(trainer, loaded.state)
    state = full_state(trainer, recipe, config, info.seed, info.step)
    written = []
    for b in range(base, max(targets) + 1):
        manifest = read_manifest(segment_dir(checkpoint_dir, b))
        files = {WEIGHTS: serialize(state.weights), REST: serialize(state.rest)}
        log = DecisionLog()
        last = b * k >= config.steps
        if not last:
            for step in range(b * k, (b + 1) * k):
                run_step(trainer, info.seed, step, log)
        trace = serialize((log.trace if not last else DecisionTrace()).to_tensors())
        weights_digest = file_digest([files[WEIGHTS]])
        leaf = leaf_of(weights_digest, rest_of(file_digest([files[REST]]), file_digest([trace])))
        if leaf != manifest.leaf:
            raise ReopenError(
                f"re-running from kept segment {base} does not reproduce the committed leaf of segment {b} "
                f"({leaf[:12]}… ≠ {manifest.leaf[:12]}…): the state cannot be opened"
            )
        if b in targets:
            write_segment_bytes(
                checkpoint_dir, b, [files[WEIGHTS]], [files[REST]], [trace], job_id=manifest.job_id,
                recipe=manifest.recipe, step=manifest.step, k=k, device=manifest.device or "cpu",
            )
            written.append(b)
        if not last:
            state = full_state(trainer, recipe, config, info.seed, (b + 1) * k)
    return written


def write_location(checkpoint_dir: Path, location: dict) -> None:
    """Record how a fresh process imports the recipe (the runtime, when it drops states)."""
    from .checkpoint import write_bytes_atomic

    Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(Path(checkpoint_dir) / LOCATION_FILE, (json.dumps(location, sort_keys=True) + "\n").encode())


def _import(location: dict) -> Recipe:
    from .recipe_import import import_recipe

    sys.path[:0] = [p for p in location.get("path", []) if p not in sys.path]
    return import_recipe(location.get("module"), location.get("script"), location["attr"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainmaster.jobs.reopen", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint_dir", type=Path)
    parser.add_argument("--segments", required=True, help="comma-separated challenged segment indices")
    args = parser.parse_args(argv)
    indices = [int(x) for x in args.segments.split(",") if x.strip()]
    wanted = missing(args.checkpoint_dir, indices)
    if not wanted:
        return 0
    try:
        location = json.loads((args.checkpoint_dir / LOCATION_FILE).read_text())
        recipe = _import(location)
        done = reopen(recipe, args.checkpoint_dir, wanted)
    except ReopenError as exc:
        print(f"reopen failed: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 — the recipe's code, or a missing location file
        print(f"reopen could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"reopened": done}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

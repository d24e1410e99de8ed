"""The self-check's fresh process (`jobs/selfcheck.py` starts it): imports the recipe the way the audit
does, then replays the segment it is handed and writes which entries of the state differ.

Command line (internal)::

    python -m trainmaster.jobs.selfcheck_child (--module NAME | --script PATH) --attr ATTR --result FILE

It reads one JSON line ``{"checkpoint_dir": …, "segment": i, "k": k}`` from stdin (end of input: it
exits quietly) and writes ``{"differ": [...]}`` (plus ``"nondeterministic": [...]`` when two replays
in this process differ from each other) or ``{"error": "..."}`` to ``FILE``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from .recipe import Recipe
from .recipe_import import import_recipe
from .selfcheck import MODULE



def replayed_differences(recipe: Recipe, checkpoint_dir: Path, segment: int, k: int) -> list[str]:
    """Replay ``segment`` from its committed S_i with its recorded decisions; the entries of the full
    state reached that differ from the committed S_{i+1} (weights by name, then the rest), plus
    ``decision <name>`` for decisions this replay would have taken otherwise."""
    return check(recipe, checkpoint_dir, segment, k)["differ"]


def check(recipe: Recipe, checkpoint_dir: Path, segment: int, k: int) -> dict:
    """The child's answer: ``{"differ": [...]}``, with ``"nondeterministic": [...]`` when the segment, replayed
    a second time here, does not even reproduce this process's own first replay — the steps are not a
    function of the state on this device (a kernel without a deterministic implementation, a clock, an
    unseeded generator), which is not what ``state()`` misses, and is said so."""
    from .checkpoint import segment_dir
    from .replay import load_state

    first = _replay(recipe, checkpoint_dir, segment, k)
    differ = _differences(first.state, load_state(segment_dir(checkpoint_dir, segment + 1))) + [
        f"decision {name}" for name, count in sorted(first.decisions.by_name.items()) if count
    ]
    if not differ:
        return {"differ": []}
    if unstable := _differences(_replay(recipe, checkpoint_dir, segment, k).state, first.state):
        return {"nondeterministic": unstable, "differ": differ}
    return {"differ": differ}


def _replay(recipe: Recipe, checkpoint_dir: Path, segment: int, k: int):
    from .checkpoint import segment_dir
    from .replay import replay_segment

    here = segment_dir(checkpoint_dir, segment)
    return replay_segment(recipe, here, k, forced_decisions=here)


def _differences(found, expected) -> list[str]:
    from .state_diff import differing

    return differing(found.weights, expected.weights) + differing(found.rest, expected.rest)


def _import_recipe(args: argparse.Namespace) -> Recipe:
    return import_recipe(args.module, args.script, args.attr)


def _write(path: Path, found: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(found))
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--module")
    where.add_argument("--script")
    parser.add_argument("--attr", required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        recipe = _import_recipe(args)
    except BaseException as exc:  # noqa: BLE001 — user code at import: whatever it raises is reported
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        _write(args.result, {"error": f"importing the recipe in a fresh process raised {last}"})
        return 1
    with contextlib.suppress(Exception):  # an optimizer's first call would import torch's compiler stack (seconds):
        importlib.import_module("torch._dynamo")  # here, while the run trains; the stand-in where it is deferred
    line = sys.stdin.readline()
    if not line:
        return 0  # the run ended before its check (it failed or was stopped)
    request = json.loads(line)
    try:
        found = check(recipe, Path(request["checkpoint_dir"]), request["segment"], request["k"])
    except Exception as exc:  # noqa: BLE001 — the recipe's own code, or a state it cannot load back
        _write(args.result, {"error": f"replaying segment {request['segment']} raised {type(exc).__name__}: {exc}"})
        return 1
    _write(args.result, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())

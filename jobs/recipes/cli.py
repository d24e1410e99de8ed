"""The command line every recipe shares: one ``--option`` per config field (``options.py``), then :func:`run`.

Shipped recipes call ``main(RECIPE, "<module>")``; a job's own recipe calls ``main(RECIPE)`` from its
script, so the entrypoint's options are its config, as the replay audit reads them (docs/runtime.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from ..canonical import CanonicalError
from ..checkpoint import CheckpointError
from ..decisions import DecisionTraceError
from ..execution import StateError
from ..recipe import Recipe
from ..runtime import run
from ..settings import SettingsError
from .options import OptionsError, parse_options, parser_for


def main(recipe: Recipe, module: str | None = None, argv: Sequence[str] | None = None) -> int:
    """Train ``recipe`` with the config its options give (``-h``: the options); 2 when they are not a config."""
    parser = parser_for(recipe, module)
    try:
        config = parse_options(recipe, sys.argv[1:] if argv is None else argv, module, add_help=True)
    except OptionsError as exc:
        parser.print_usage(sys.stderr)
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    try:
        result = run(recipe, config)
    except (CanonicalError, CheckpointError, DecisionTraceError, SettingsError, StateError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.result, indent=2, sort_keys=True))
    return 0

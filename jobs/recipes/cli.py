"""The command line every recipe shares: one ``--option`` per config field, then :func:`run`.

Shipped recipes call ``main(RECIPE, "<module>")``; a job's own recipe calls ``main(RECIPE)`` from its
script, so the entrypoint's options are its config, as the replay audit reads them (docs/runtime.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from ..canonical import CanonicalError
from ..checkpoint import CheckpointError
from ..decisions import DecisionTraceError
from ..execution import StateError
from ..recipe import Recipe
from ..runtime import run
from ..settings import SettingsError


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parser_for(recipe: Recipe, module: str | None = None) -> argparse.ArgumentParser:
    """The recipe's options; ``module``: a shipped recipe's module (None: the script being run)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m trainmaster.jobs.recipes.{module}" if module else os.path.basename(sys.argv[0]),
        description=f"Train the {recipe.name} recipe. Settings come from the TRAINMASTER_* environment.",
    )
    for name, field in recipe.config_type.model_fields.items():
        kind = _flag if field.annotation is bool else field.annotation
        parser.add_argument(
            f"--{name.replace('_', '-')}", dest=name, type=kind, default=None,
            help=f"{field.description or name} (default {field.default})",
        )
    return parser


def main(recipe: Recipe, module: str | None = None, argv: Sequence[str] | None = None) -> int:
    parser = parser_for(recipe, module)
    args = parser.parse_args(argv)
    try:
        config = recipe.config({k: v for k, v in vars(args).items() if v is not None})
    except ValidationError as exc:
        parser.error(str(exc))
    try:
        result = run(recipe, config)
    except (CanonicalError, CheckpointError, DecisionTraceError, SettingsError, StateError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.result, indent=2, sort_keys=True))
    return 0

"""A recipe's command line, parsed by the config model's own types: the one parser of the job and the audit.

argparse only splits the words into one ``--option`` per config field (``--d-model 16``, ``--act=tanh``);
every value is then validated by pydantic against the config type, all fields at once, in JSON mode:

- numbers, booleans (``true``/``false``/``yes``/``no``/``on``/``off``/``1``/``0``; ``--flag`` alone is
  true), strings, string choices (``Literal``) and enums are written as they are: ``--act tanh``;
- lists, tuples, sets, dicts, nested models and choices of non-strings are written as JSON:
  ``--widths '[64, 32]'``, ``--optim '{"name": "adam"}'`` — ``--widths 64`` is an error, never ``[6, 4]``;
- a field that may be None takes ``null``.

Nothing is read from the environment, so a job and its replay audit get the same config from the same words.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from collections.abc import Mapping, Sequence, Set
from typing import Annotated, Any, Literal, NoReturn, Protocol, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from ..recipe_config import RecipeConfig

NULL = "null"
DEVICE_DEFAULT = "auto"
DEVICE_HELP = (
    "where to train: auto (CUDA when the job has a GPU, else the CPU), cpu or cuda; a verifier re-executes "
    "on its own device (docs/runtime.md, Devices)"
)
_UNIONS = (Union, types.UnionType)
_ANY = TypeAdapter(Any)
_CONTAINERS = (list, tuple, set, frozenset, dict, Sequence, Mapping, Set)


class Configurable(Protocol):
    """What the parser reads of a recipe: its name and its config type. A :class:`Recipe` is one; so is a shipped
    recipe's ``ShippedConfig`` (``jobs/recipes/__init__.py``), which parses a spec's options without torch."""

    @property
    def name(self) -> str: ...

    @property
    def config_type(self) -> type[RecipeConfig]: ...


class OptionsError(ValueError):
    """The words are not a valid config of the recipe (the message names the option and why)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise OptionsError(message)


def parser_for(recipe: Configurable, module: str | None = None, *, add_help: bool = True) -> argparse.ArgumentParser:
    """The recipe's options, each kept as its text; ``module``: a shipped recipe's module (None: the script run)."""
    parser = _Parser(
        prog=f"python -m trainmaster.jobs.recipes.{module}" if module else os.path.basename(sys.argv[0]),
        description=f"Train the {recipe.name} recipe. Settings come from the TRAINMASTER_* environment.",
        add_help=add_help, allow_abbrev=False,
    )
    for name, field in recipe.config_type.model_fields.items():
        flag = _is_bool(field.annotation)
        parser.add_argument(
            f"--{name.replace('_', '-')}", dest=name, default=None, nargs="?" if flag else None,
            const="true" if flag else None, metavar="JSON" if is_json(field.annotation) else None,
            help=f"{field.description or name} (default {_default_json(field) or 'none: required'})",
        )
    return parser


def parse_options(recipe: Configurable, argv: Sequence[str], module: str | None = None, *, add_help: bool = False) -> RecipeConfig:
    """The recipe's config from its command-line words; OptionsError naming the option when they are not one."""
    parser = parser_for(recipe, module, add_help=add_help)
    known, unknown = parser.parse_known_args(list(argv))
    if unknown:
        raise OptionsError(f"options the {recipe.name} recipe does not take: {' '.join(unknown)}")
    fields = recipe.config_type.model_fields
    values = {name: _decoded(name, fields[name], text) for name, text in vars(known).items() if text is not None}
    try:
        return recipe.config_type.model_validate_json(json.dumps(values))
    except ValidationError as exc:
        raise OptionsError("; ".join(_problem(error, fields) for error in exc.errors())) from None


def is_json(annotation: Any) -> bool:
    """Whether an option of this type is written as JSON: a container, a nested model, a choice of non-strings."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return is_json(get_args(annotation)[0])
    if origin in _UNIONS:
        return any(is_json(arg) for arg in get_args(annotation) if arg is not type(None))
    if origin is Literal:
        return any(not isinstance(value, str) for value in get_args(annotation))
    kind = origin or annotation
    return isinstance(kind, type) and not issubclass(kind, (str, bytes)) and issubclass(kind, (*_CONTAINERS, BaseModel))


def _decoded(name: str, field: FieldInfo, text: str) -> Any:
    """One option's text as the JSON value it stands for: itself, or parsed when its type is written as JSON."""
    if text == NULL and _admits_none(field.annotation):
        return None
    if not is_json(field.annotation):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionsError(f"--{name.replace('_', '-')}: not valid JSON ({exc.msg}){_json_hint(name, field)}") from None


def _problem(error: Mapping[str, Any], fields: Mapping[str, FieldInfo]) -> str:
    """One validation error, named by its option (``--widths.1``); a whole-config error by the recipe's check."""
    if not error["loc"]:
        return error["msg"]
    where = ".".join(str(part) for part in error["loc"])
    field = fields.get(str(error["loc"][0]))
    hint = _json_hint(where, field) if field is not None and len(error["loc"]) == 1 and is_json(field.annotation) else ""
    return f"--{where.replace('_', '-')}: {error['msg']}{hint}"


def _json_hint(name: str, field: FieldInfo) -> str:
    example = _default_json(field)
    option = f"--{name.replace('_', '-')}"
    return f"; written as JSON, e.g. {option} '{example}'" if example else "; written as JSON"


def _admits_none(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return _admits_none(get_args(annotation)[0])
    return annotation is None or annotation is type(None) or (
        get_origin(annotation) in _UNIONS and type(None) in get_args(annotation))


def _is_bool(annotation: Any) -> bool:
    if get_origin(annotation) in _UNIONS:
        return set(get_args(annotation)) == {bool, type(None)}
    return annotation is bool


def _default_json(field: FieldInfo) -> str | None:
    """The field's default as it would be written on the command line (JSON), or None when it has none."""
    return None if field.is_required() else _ANY.dump_json(field.get_default(call_default_factory=True)).decode()

"""Load a user-written YAML file into a pydantic model, with errors that name file, line and field.

PyYAML gives positions only on its node tree, so the file is composed once into nodes (refusing
duplicate keys, which plain `safe_load` silently merges), turned into Python data, validated, and
each pydantic error location is walked back through the node tree to a line number.

A user file is not trusted to be small in memory: aliases (`*name`) are refused, so a kilobyte of
nested aliases cannot expand into billions of nodes, and nesting deeper than `MAX_DEPTH` is refused
before the (recursive) composer could overflow the stack. Both are `file:line` errors like any other.

Nor is it trusted to be a file: it is read through `jobs/userfile.py` (regular files only, never blocking on a
FIFO, at most `MAX_USER_FILE_BYTES`), and what that refuses is a `FileError` naming the file and the reason.
"""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from trainmaster.jobs.userfile import UnreadableFile, read_user_text

M = TypeVar("M", bound=BaseModel)

MAX_DEPTH = 100
"""Mappings and sequences nested deeper than this are refused (real specs and policies use under ten)."""


class FileError(ValueError):
    """A user file that cannot be used; `problems` holds one line per issue, each `file:line: field: why`."""

    def __init__(self, path: Path | str, problems: list[str]):
        self.path = str(path)
        self.problems = problems
        super().__init__("\n".join(problems))


def load_model(path: Path | str, model: type[M], *, text: str | None = None, context: dict | None = None) -> M:
    """Read `path` (or `text`, naming it `path` in errors) and validate it as `model`."""
    path = Path(path)
    if text is None:
        try:
            text = read_user_text(path)
        except FileNotFoundError:
            raise FileError(path, [f"{path}: no such file"]) from None
        except UnreadableFile as exc:
            raise FileError(path, [f"{path}: {exc.reason}"]) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise FileError(path, [f"{path}: cannot read: {exc}"]) from None
    root = _compose(path, text)
    data = _to_python(path, root)
    if data is None:
        raise FileError(path, [f"{path}:1: the file is empty"])
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise FileError(path, [_describe(path, root, model, err) for err in exc.errors()]) from None


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader whose composer refuses aliases and nesting deeper than `MAX_DEPTH`."""

    _depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in this file", self.peek_event().start_mark)
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _compose(path: Path, text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_BoundedLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise FileError(path, [f"{where}: invalid YAML: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise FileError(path, [f"{path}: invalid YAML: {exc}"]) from None


def _to_python(path: Path, node: yaml.Node | None) -> Any:
    if node is None:
        return None
    _refuse_duplicate_keys(path, node)
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise FileError(path, [f"{path}:{mark.line + 1}: {exc.problem}"]) from None
    finally:
        loader.dispose()


def _refuse_duplicate_keys(path: Path, node: yaml.Node) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name in seen:
                raise FileError(
                    path,
                    [f"{path}:{key.start_mark.line + 1}: {name}: duplicate key (first on line {seen[name]})"],
                )
            if name is not None:
                seen[name] = key.start_mark.line + 1
            _refuse_duplicate_keys(path, value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(path, item)


def _describe(path: Path, root: yaml.Node, model: type[BaseModel], err: dict) -> str:
    loc = [part for part in err["loc"] if not _is_union_tag(part)]
    line = _line_of(root, loc, key_line=err["type"] == "extra_forbidden")
    field = ".".join(str(p) for p in loc) or "(top level)"
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        allowed = _field_names(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        message = "unknown field" + (f"; did you mean '{close[0]}'?" if close else "")
        if allowed and not close:
            message += f" (allowed: {', '.join(sorted(allowed))})"
    elif err["type"] == "missing":
        message = "required field is missing"
    return f"{path}:{line}: {field}: {message}"


def _is_union_tag(part: Any) -> bool:
    """pydantic inserts the member type's name (e.g. `function-after[...]`) into union error locations."""
    return isinstance(part, str) and ("[" in part or part in {"str", "int", "float", "bool", "list", "dict"})


def _line_of(node: yaml.Node | None, loc: list, *, key_line: bool) -> int:
    """The 1-based line of the deepest node of `loc` that exists in the file."""
    line = node.start_mark.line + 1 if node is not None else 1
    for i, part in enumerate(loc):
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    last = i == len(loc) - 1
                    child = key if (key_line and last) else value
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


def _field_names(model: type[BaseModel], loc: list) -> list[str]:
    """Names allowed at `loc` inside `model`, following nested models, lists and dicts."""
    current: Any = model
    for part in loc:
        current = _unwrap(current, part)
        if current is None:
            return []
    current = _unwrap(current, None)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields) + [f.alias for f in current.model_fields.values() if f.alias]
    return []


def _unwrap(tp: Any, part: Any) -> Any:
    """Step one location part into a type: a model field, a list item or a dict value."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found = _unwrap(arg, part)
            if found is not None:
                return found
        return None
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0], part)
    if part is None:
        return tp
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(str(part))
        return field.annotation if field else None
    if origin in (list, tuple, set, frozenset) and isinstance(part, int):
        return typing.get_args(tp)[0]
    if origin is dict:
        return typing.get_args(tp)[1]
    return None

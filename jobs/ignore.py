"""Ignore rules for bundles: the built-in list plus a `.trainmasterignore` matched by git's own rules.

`.trainmasterignore` is read as git reads a `.gitignore` (`jobs/gitignore.py`: `pathspec.GitIgnoreSpec`,
tested against `git check-ignore`): one pattern per line, the last matching pattern wins; `#` comments, `!`
negation, a trailing `/` for directories only, a `/` at the start or in the middle anchors the
pattern to the code directory, `*`/`?`/`[...]` never match `/`, `**` crosses directories, `\\`
escapes the next character (`esc\\ ` keeps a trailing space; unescaped trailing spaces are dropped).

As in git, the walk does not descend into an ignored directory, so nothing below it can be
re-included; re-include by ignoring `dir/*` instead of `dir/`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathspec import GitIgnoreSpec

IGNORE_FILE = ".trainmasterignore"

# Entries with these names are skipped whatever their type (a `.git` file in a submodule, a
# `.venv` symlink to a venv elsewhere), and `.trainmasterignore` cannot re-include them.
ALWAYS_IGNORED_NAMES = frozenset(
    {".git", "__pycache__", ".venv", "venv", ".trainmaster", "node_modules", ".pytest_cache", ".mypy_cache"}
)
ALWAYS_IGNORED_SUFFIXES = (".pyc",)
VENV_MARKER = "pyvenv.cfg"  # a directory holding this file is a virtualenv, whatever its name


def always_ignored(name: str) -> bool:
    """Whether an entry called `name` is ignored by the built-in rules (the venv marker aside)."""
    return name in ALWAYS_IGNORED_NAMES or name.endswith(ALWAYS_IGNORED_SUFFIXES)


class IgnoreRules:
    """The parsed patterns of one `.trainmasterignore` file."""

    def __init__(self, spec: GitIgnoreSpec | None) -> None:
        self._spec = spec

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        from .gitignore import compile_rules  # pathspec: imported by what bundles or selects outputs only

        return cls(compile_rules(text))

    @classmethod
    def from_dir(cls, code_dir: Path) -> IgnoreRules:
        """The rules of `code_dir/.trainmasterignore`; none when the file is absent."""
        path = code_dir / IGNORE_FILE
        if not path.is_file():
            return cls(None)
        return cls.parse(path.read_text(encoding="utf-8"))

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        """Whether the POSIX path `rel_path` (relative to the code directory) is ignored, as git says when its
        folders are not (the walk never asks about what is below an ignored folder)."""
        if self._spec is None:
            return False
        if is_dir:
            from .gitignore import folder_ignored

            return folder_ignored(self._spec, rel_path)
        return self._spec.match_file(rel_path)

"""Ignore rules for bundles: the built-in list, likely secrets, then a `.trainmasterignore` matched by git's
own rules.

`.trainmasterignore` is read as git reads a `.gitignore` (`jobs/gitignore.py`: `pathspec.GitIgnoreSpec`,
tested against `git check-ignore`): one pattern per line, the last matching pattern wins; `#` comments, `!`
negation, a trailing `/` for directories only, a `/` at the start or in the middle anchors the
pattern to the code directory, `*`/`?`/`[...]` never match `/`, `**` crosses directories, `\\`
escapes the next character (`esc\\ ` keeps a trailing space; unescaped trailing spaces are dropped).

As in git, the walk does not descend into an ignored directory, so nothing below it can be
re-included; re-include by ignoring `dir/*` instead of `dir/`.

Before the file's own patterns come `SECRET_PATTERNS`: key and credential files (`.ssh/`, `.aws/`,
`.env`, `*.pem`, `id_rsa`…) are left out by default, since a bundle goes to whoever runs the job. The
file can bring one back (`!.env`), its patterns coming later; `IgnoreRules.left_out_as_secret` tells
the bundler which entries were left out by these defaults alone, so it can say so.
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

SECRET_PATTERNS = (
    ".ssh/", ".aws/", ".gnupg/", ".azure/", ".kube/", ".docker/",
    ".env", ".env.*", ".netrc", ".pypirc", ".npmrc", ".git-credentials",
    "*.pem", "*.p12", "*.pfx", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
)
"""Left out of every bundle unless `.trainmasterignore` re-includes them (`!.env`): likely secrets."""


def always_ignored(name: str) -> bool:
    """Whether an entry called `name` is ignored by the built-in rules (the venv marker aside)."""
    return name in ALWAYS_IGNORED_NAMES or name.endswith(ALWAYS_IGNORED_SUFFIXES)


class IgnoreRules:
    """The patterns of one ignore file, in order; the first `defaults` of them are `SECRET_PATTERNS`."""

    def __init__(self, spec: GitIgnoreSpec | None, defaults: int = 0) -> None:
        self._spec = spec
        self._defaults = defaults

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        from .gitignore import compile_rules  # pathspec: imported by what bundles or selects outputs only

        return cls(compile_rules(text))

    @classmethod
    def from_dir(cls, code_dir: Path) -> IgnoreRules:
        """`SECRET_PATTERNS`, then the rules of `code_dir/.trainmasterignore` (when the file exists)."""
        path = code_dir / IGNORE_FILE
        return cls.with_secret_defaults(path.read_text(encoding="utf-8") if path.is_file() else "")

    @classmethod
    def with_secret_defaults(cls, text: str) -> IgnoreRules:
        """`SECRET_PATTERNS` followed by the patterns of `text` (which may re-include a secret)."""
        from .gitignore import compile_rules

        return cls(compile_rules("\n".join(SECRET_PATTERNS) + "\n" + text), len(SECRET_PATTERNS))

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        """Whether the POSIX path `rel_path` (relative to the code directory) is ignored, as git says when its
        folders are not (the walk never asks about what is below an ignored folder)."""
        if self._spec is None:
            return False
        if is_dir:
            from .gitignore import folder_ignored

            return folder_ignored(self._spec, rel_path)
        return self._spec.match_file(rel_path)

    def left_out_as_secret(self, rel_path: str, *, is_dir: bool) -> bool:
        """Whether `rel_path` is ignored, and the pattern that decided it is one of `SECRET_PATTERNS`."""
        if not self._defaults or not self.ignored(rel_path, is_dir=is_dir):
            return False
        from .gitignore import deciding_pattern

        decided = deciding_pattern(self._spec, rel_path, is_dir=is_dir)
        return decided is not None and decided < self._defaults

"""Ignore rules for bundles: the built-in list plus a gitignore-like `.trainmasterignore`.

Pattern syntax (one per line, the last matching pattern wins):

- blank lines and lines starting with `#` are skipped; `\\#` and `\\!` start a literal `#`/`!`;
- `!pattern` re-includes what an earlier pattern ignored;
- a trailing `/` makes the pattern match directories only;
- a pattern with a `/` at the start or in the middle is anchored to the code directory root and
  matched against the whole relative path; without one it matches the name at any depth;
- globs: `*` and `?` never match `/`, `**` matches across directories (`**/x`, `a/**`, `a/**/b`),
  `[abc]`/`[!abc]` are character classes, `\\` escapes the next character.

As in git, the walk does not descend into an ignored directory, so nothing below it can be
re-included; re-include by ignoring `dir/*` instead of `dir/`.

Before the file's own patterns come `SECRET_PATTERNS`: key and credential files (`.ssh/`, `.aws/`,
`.env`, `*.pem`, `id_rsa`…) are left out by default, since a bundle goes to whoever runs the job. The
file can bring one back (`!.env`), its patterns coming later; `IgnoreRules.left_out_as_secret` tells
the bundler which entries were left out by these defaults alone, so it can say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class _Pattern:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    anchored: bool


class IgnoreRules:
    """The parsed patterns of one `.trainmasterignore` file."""

    def __init__(self, patterns: list[_Pattern], defaults: int = 0) -> None:
        self._patterns = patterns
        self._defaults = defaults  # the first `defaults` patterns are SECRET_PATTERNS

    @classmethod
    def parse(cls, text: str) -> IgnoreRules:
        return cls([p for p in map(_parse_line, text.splitlines()) if p is not None])

    @classmethod
    def from_dir(cls, code_dir: Path) -> IgnoreRules:
        """`SECRET_PATTERNS`, then the rules of `code_dir/.trainmasterignore` (when the file exists)."""
        path = code_dir / IGNORE_FILE
        text = path.read_text(encoding="utf-8") if path.is_file() else ""
        return cls.with_secret_defaults(text)

    @classmethod
    def with_secret_defaults(cls, text: str) -> IgnoreRules:
        """`SECRET_PATTERNS` followed by the patterns of `text` (which may re-include a secret)."""
        defaults = [p for p in map(_parse_line, SECRET_PATTERNS) if p is not None]
        return cls(defaults + cls.parse(text)._patterns, len(defaults))

    def ignored(self, rel_path: str, *, is_dir: bool) -> bool:
        """Whether the POSIX path `rel_path` (relative to the code directory) is ignored."""
        last = self._last_match(rel_path, is_dir)
        return last is not None and not self._patterns[last].negate

    def left_out_as_secret(self, rel_path: str, *, is_dir: bool) -> bool:
        """Whether `rel_path` is ignored by `SECRET_PATTERNS` and no later pattern decides otherwise."""
        last = self._last_match(rel_path, is_dir)
        return last is not None and last < self._defaults

    def _last_match(self, rel_path: str, is_dir: bool) -> int | None:
        name = rel_path.rpartition("/")[2]
        last = None
        for i, pattern in enumerate(self._patterns):
            if pattern.dir_only and not is_dir:
                continue
            if pattern.regex.fullmatch(rel_path if pattern.anchored else name):
                last = i
        return last


def _parse_line(line: str) -> _Pattern | None:
    line = line.rstrip()
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line
    line = line.lstrip("/")
    if not line:
        return None
    return _Pattern(re.compile(_glob_to_regex(line)), negate, dir_only, anchored)


def _glob_to_regex(glob: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[":
            regex, i = _char_class(glob, i)
            out.append(regex)
        elif glob[i] == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def _char_class(glob: str, start: int) -> tuple[str, int]:
    """Translate the `[...]` class at `start`; returns its regex and the index after it."""
    i = start + 1
    if i < len(glob) and glob[i] in "!^":
        i += 1
    if i < len(glob) and glob[i] == "]":  # a `]` first in the class is literal
        i += 1
    end = glob.find("]", i)
    if end < 0:
        return re.escape("["), start + 1
    body = glob[start + 1 : end]
    negate = body[0] in "!^"
    if negate:
        body = body[1:]
    body = re.sub(r"([\\\[&~|^])", r"\\\1", body)
    return (f"[^/{body}]" if negate else f"[{body}]"), end + 1

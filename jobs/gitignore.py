"""git's `.gitignore` matching, from `pathspec.GitIgnoreSpec`, with the few cases where it and `git check-ignore`
disagree brought back to git (each one pinned by tests/jobs/test_ignore_git.py):

- trailing spaces are dropped unless escaped, as git's `trim_trailing_spaces` does (`both\\  ` is `both\\ `;
  pathspec refuses it);
- a pattern git cannot parse (a trailing lone `\\`) is skipped, as git skips it (pathspec raises);
- a negated class never matches `/` (`a[!x]b` does not match `a/b`);
- `dir/**` matches what is inside `dir`, not the folder `dir` itself (so `!dir/keep` can re-include).

Imported only by what bundles code or selects outputs (`jobs/ignore.py` imports it when it parses rules).
"""

from __future__ import annotations

import re

from pathspec import GitIgnoreSpec
from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

_NEGATED_CLASS = re.compile(r"\[\^(\]?)")  # `[^` and a literal `]` first in the class, in pathspec's regex


class _Pattern(GitIgnoreSpecPattern):
    """pathspec's pattern, its negated classes kept off `/` as git's are."""

    __slots__ = ()

    @classmethod
    def pattern_to_regex(cls, pattern):
        regex, include = super().pattern_to_regex(pattern)
        return (_NEGATED_CLASS.sub(r"[^\1/", regex) if isinstance(regex, str) else regex), include


def compile_rules(text: str) -> GitIgnoreSpec:
    """The patterns of an ignore file's ``text``, in order."""
    lines = [line for line in map(_trimmed, text.splitlines()) if _valid(line)]
    return GitIgnoreSpec.from_lines(lines, pattern_factory=_Pattern)


def folder_ignored(spec: GitIgnoreSpec, rel_path: str) -> bool:
    """Whether git ignores the folder ``rel_path`` itself: the last pattern that matches it decides."""
    decided = deciding_pattern(spec, rel_path, is_dir=True)
    return decided is not None and bool(spec.patterns[decided].include)


def deciding_pattern(spec: GitIgnoreSpec, rel_path: str, *, is_dir: bool) -> int | None:
    """The index of the last pattern that matches ``rel_path`` (a folder when ``is_dir``): the one that
    decides whether it is ignored; None when none matches."""
    decided = None
    for i, pattern in enumerate(spec.patterns):
        if pattern.include is None:
            continue
        if _matches_folder(pattern, rel_path) if is_dir else pattern.match_file(rel_path):
            decided = i
    return decided


def _matches_folder(pattern: GitIgnoreSpecPattern, rel_path: str) -> bool:
    inside_only = pattern.pattern.endswith("/**")  # `dir/**` matches below `dir`, not `dir`
    return bool(pattern.match_file(rel_path if inside_only else f"{rel_path}/"))


def _trimmed(line: str) -> str:
    """``line`` without its trailing spaces, unless escaped (git's `trim_trailing_spaces`)."""
    last_space, i = None, 0
    while i < len(line):
        if line[i] == " ":
            last_space = i if last_space is None else last_space
        else:
            last_space = None
            i += line[i] == "\\"  # an escaped character is never a trailing space
        i += 1
    return line if last_space is None else line[:last_space]


def _valid(line: str) -> bool:
    try:
        _Pattern(line)
    except ValueError:
        return False
    return True

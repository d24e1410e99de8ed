"""`.trainmasterignore` follows git's own rules: each case's tree is bundled and compared with what git leaves
untracked-and-not-ignored for the same `.gitignore`, and each path with `git check-ignore` — negation,
directory-only patterns, `**`, character classes, escapes and trailing spaces."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trainmaster.jobs.bundle import collect
from trainmaster.jobs.ignore import IGNORE_FILE, IgnoreRules

# (rules, files); a name ending in `/` is an empty directory. `.gitignore` and the rules file are left out of the
# comparison (each tool sees its own).
CASES = {
    "negation": ("*.log\n!keep.log\nsub/*.tmp\n!sub/b.tmp\n",
                 ["a.log", "keep.log", "sub/keep.log", "sub/c.log", "sub/a.tmp", "sub/b.tmp", "x.tmp"]),
    "negation inside an ignored directory": ("out/\n!out/keep.txt\nres/*\n!res/keep.txt\n",
                                              ["out/keep.txt", "out/x.txt", "res/keep.txt", "res/x.txt", "o.txt"]),
    "directory only": ("build/\ndata/raw/\n", ["build/x.py", "src/build/y.py", "lib/build", "data/raw/a.csv",
                                                "data/rawfile", "other/data/raw/b.csv"]),
    "inside a folder only": ("logs/**\n!logs/keep.txt\nrun/**\n!run/sub/\n",
                             ["logs/keep.txt", "logs/x.txt", "logs/empty/", "run/sub/a.txt", "run/b.txt", "run/c/d.txt"]),
    "a pattern git cannot parse": ("bad\\\nok.txt\n", ["bad", "bad\\", "ok.txt"]),
    "anchored": ("/top\nmid/dir\n", ["top", "sub/top", "mid/dir", "x/mid/dir", "mid/dirx"]),
    "double star": ("**/cache\nlogs/**\na/**/z\n**/deep/*.bin\n",
                    ["cache/x", "p/q/cache/y", "cachex", "logs/a/b", "logs/c", "logsx/d", "a/z", "a/b/c/z", "a/zz",
                     "deep/w.bin", "m/deep/w.bin", "m/deep/n/w.bin"]),
    "stars and question marks": ("*.py[co]\nfile?.txt\nd*/e\n", ["a.pyc", "a.pyo", "a.py", "file1.txt", "file10.txt",
                                                                 "dx/e", "dx/y/e", "e"]),
    "character classes": ("file[0-9].txt\nx[!a-c]y\nz[]]w\nr[a-]s\nm[^q]n\nu[!]]v\n",
                          ["file1.txt", "filea.txt", "xdy", "xby", "x/y", "z]w", "zaw", "r-s", "ras", "rbs", "mpn",
                           "m/n", "mqn", "u]v", "uav", "u/v"]),
    "escapes": ("\\#hash\n\\!bang\nstar\\*\nq\\?\n", ["#hash", "!bang", "star*", "starx", "q?", "qx"]),
    "escaped trailing space": ("esc\\ \nlit\\ er\n", ["esc ", "esc", "lit er", "liter"]),
    "trailing spaces": ("trail   \nboth\\  \n", ["trail", "trail   ", "both ", "both", "both  "]),
    "comments and blanks": ("# comment\n\n   \n#notes\n", ["# comment", "#notes", "notes"]),
    "last match wins": ("*.csv\n!important.csv\nimportant.csv\n!*.md\n*.md\n", ["a.csv", "important.csv", "b.md"]),
    "unclosed bracket": ("[unclosed\n", ["[unclosed", "u"]),
}


def _tree(root: Path, rules: str, files: list[str]) -> Path:
    root.mkdir(parents=True)
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir() if name.endswith("/") else path.write_text("x")
    (root / ".gitignore").write_text(rules)
    (root / IGNORE_FILE).write_text(rules)
    return root


def _git(root: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", "-c", "core.excludesFile=/dev/null", *args], cwd=root, input=stdin,
                          capture_output=True, text=True, check=args[0] != "check-ignore").stdout


def _git_kept(root: Path) -> set[str]:
    _git(root, "init", "-q")
    return {p for p in _git(root, "ls-files", "--others", "--exclude-standard", "-z").split("\0") if p}


def _ours_kept(root: Path) -> set[str]:
    return {entry.path for entry in collect(root) if entry.kind == "file"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bundle_keeps_what_git_does_not_ignore(tmp_path, case):
    rules, files = CASES[case]
    root = _tree(tmp_path / "code", rules, files)
    rule_files = {".gitignore", IGNORE_FILE}
    assert _ours_kept(root) - rule_files == _git_kept(root) - rule_files


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_path_matches_as_git_check_ignore_says(tmp_path, case):
    rules, files = CASES[case]
    root = _tree(tmp_path / "code", rules, files)
    _git(root, "init", "-q")
    paths = sorted({"/".join(name.rstrip("/").split("/")[: i + 1]) for name in files
                    for i in range(name.rstrip("/").count("/") + 1)})
    git_ignored = set(_git(root, "check-ignore", "--no-index", "--stdin", "-z", stdin="\0".join(paths)).split("\0"))
    parsed = IgnoreRules.parse(rules)
    for path in paths:  # as the walk asks: a path whose folder is ignored is never asked about
        if any(parsed.ignored(path[:i], is_dir=True) for i in range(len(path)) if path[i] == "/"):
            continue
        assert parsed.ignored(path, is_dir=(root / path).is_dir()) == (path in git_ignored), (case, path)


def _dry_run_bundle(spec: Path) -> dict:
    import json
    import os
    import sys

    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)["bundle"]


def _files(root: Path, rules: str, files: list[str]) -> None:
    (root / IGNORE_FILE).write_text(rules)
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x")


def test_submit_bundles_what_git_would_commit(tm_home, job_factory):
    rules = "esc\\ \nlogs/**\n!logs/keep.txt\n[unclosed\n"
    full = job_factory("print('hi')\n")
    _files(full.parent, rules, ["esc ", "esc", "logs/keep.txt", "logs/x.txt", "[unclosed"])
    kept = job_factory("print('hi')\n")
    _files(kept.parent, rules, ["esc", "logs/keep.txt", "[unclosed"])  # what git keeps of the same tree
    (full.parent / ".gitignore").write_text(rules)
    assert {p for p in _git_kept(full.parent) if p != ".gitignore"} == {p.relative_to(kept.parent).as_posix() for p in
                                                                         kept.parent.rglob("*") if p.is_file()}
    (full.parent / ".gitignore").unlink()
    shutil.rmtree(full.parent / ".git")
    assert _dry_run_bundle(full) == _dry_run_bundle(kept)

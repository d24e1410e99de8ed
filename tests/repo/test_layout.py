"""The tests mirror the package's folders (docs/architecture.md §1): a test file sits in tests/<folder>/ where
<folder> is a folder of the package (broker/cli/, backends/ray/, jobs/, ...) holding what it tests, or in one of
the few folders that are no package's: e2e/ (a user's path across several parts), repo/ (checks of the repository
as a whole) and benchmarks/ (the benchmarks' smoke runs, beside them). Helpers stay in tests/ itself, importable
from every folder (pyproject.toml: `pythonpath = ["tests"]`); test files are imported by their file name
(`--import-mode=prepend`, no `__init__.py` in the mirrored folders), so no two share one."""

from __future__ import annotations

import tomllib
from collections import Counter
from pathlib import Path

from repo_paths import ROOT, TESTS

PACKAGE = ("broker", "backends", "jobs", "verify", "wallet", "storage", "configs")
OWN_FOLDERS = {"e2e": "a user's path across several parts", "repo": "checks of the repository as a whole",
               "benchmarks": "each benchmark's smoke run, beside the benchmarks"}
NOT_TESTS = ("azurite", "data", "gpu", "clouds", "remote_executor", "cheating_miners", "child_site")
"""Folders of tests/ that hold what the tests use (servers' packages, data, helper packages), never a test file."""


def _test_files(tests: Path) -> list[Path]:
    return sorted(p for p in tests.rglob("test_*.py")
                  if p.relative_to(tests).parts[0] not in NOT_TESTS and "__pycache__" not in p.parts)


def misplaced(root: Path, tests: Path) -> list[str]:
    """`path: why` for each test file outside the mirrored layout."""
    found = []
    for path in _test_files(tests):
        folder = path.parent.relative_to(tests)
        where = path.relative_to(root).as_posix()
        if folder == Path("."):
            found.append(f"{where}: directly in tests/; move it to the folder of what it tests")
        elif folder.parts[0] in OWN_FOLDERS:
            if len(folder.parts) > 1:
                found.append(f"{where}: {folder.parts[0]}/ has no subfolders")
        elif folder.parts[0] not in PACKAGE or not (root / folder).is_dir():
            found.append(f"{where}: {folder.as_posix()}/ is no folder of the package (nor one of "
                         f"{', '.join(sorted(OWN_FOLDERS))})")
    return found


def test_every_test_file_sits_in_the_folder_of_what_it_tests():
    found = misplaced(ROOT, TESTS)
    assert not found, "test files outside the mirrored layout:\n" + "\n".join(f"  {line}" for line in found)
    assert len(_test_files(TESTS)) > 150


def test_no_two_test_files_share_a_name_and_the_folders_are_no_packages():
    named = Counter(p.name for p in _test_files(TESTS))
    assert not [name for name, count in named.items() if count > 1], named.most_common(3)
    packages = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob("__init__.py")
                if p.relative_to(TESTS).parts[0] not in NOT_TESTS]
    assert packages == [], packages
    helpers = [p.relative_to(TESTS).as_posix() for p in TESTS.rglob("*.py") if p.parent != TESTS
               and p.relative_to(TESTS).parts[0] not in (*NOT_TESTS, "benchmarks") and not p.name.startswith("test_")]
    assert helpers == [], f"helpers belong in tests/ itself: {helpers}"


def test_the_import_mode_is_explicit():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert settings["pythonpath"] == ["tests"] and "--import-mode=prepend" in settings["addopts"].split()


def test_the_check_sees_a_misplaced_file(tmp_path):
    (tmp_path / "broker" / "cli").mkdir(parents=True)
    tests = tmp_path / "tests"
    for where in ("test_top.py", "broker/cli/test_ok.py", "brokers/test_typo.py", "e2e/test_fine.py",
                  "e2e/deep/test_deep.py", "clouds/test_helper_package.py", "broker/nowhere/test_gone.py"):
        (tests / where).parent.mkdir(parents=True, exist_ok=True)
        (tests / where).write_text("")
    assert [line.split(":")[0] for line in misplaced(tmp_path, tests)] == [
        "tests/broker/nowhere/test_gone.py", "tests/brokers/test_typo.py", "tests/e2e/deep/test_deep.py",
        "tests/test_top.py"]

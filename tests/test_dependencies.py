"""What pyproject declares is what the code imports, where it imports it: every core dependency is imported by
the package, every third-party module the package imports comes from a declared dependency (core or an extra),
and what only the tests use is in the `dev` extra."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("broker", "backends", "jobs", "verify", "wallet")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!;~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def _imported_distributions(paths) -> set[str]:
    """Distributions providing the top-level modules these files import (stdlib and trainmaster left out)."""
    provided = packages_distributions()
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for top in {m.split(".")[0] for m in modules} - set(sys.stdlib_module_names) - {"trainmaster"}:
                found |= {d.lower().replace("_", "-") for d in provided.get(top, [top])}
    return found


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _package_files():
    return [p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py")]


def test_every_core_dependency_is_imported_by_the_package():
    core = _names(_project()["dependencies"])
    assert core - _imported_distributions(_package_files()) == set()


def test_the_package_imports_only_declared_distributions():
    project = _project()
    declared = _names(project["dependencies"]) | {n for extra in project["optional-dependencies"].values()
                                                   for n in _names(extra)}
    undeclared = {name for name in _imported_distributions(_package_files()) - declared
                  if not any(d.startswith(f"{name}-") for d in declared)}  # google, azure: extras not installed here
    assert undeclared <= {"bittensor-core", "botocore"}, undeclared  # brought by the bittensor and aws extras


def test_what_only_the_tests_use_is_in_dev():
    project = _project()
    core, dev = _names(project["dependencies"]), _names(project["optional-dependencies"]["dev"])
    tests_only = _imported_distributions((ROOT / "tests").rglob("*.py")) - _imported_distributions(_package_files())
    assert "safetensors" in tests_only and "safetensors" in dev and "safetensors" not in core
    assert "cryptography" not in core

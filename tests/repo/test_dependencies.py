"""What pyproject declares is what the code imports, where it imports it: every core dependency is imported by
the package, every third-party module the package imports comes from a declared dependency (core or an extra),
and what only the tests use is in the `dev` extra."""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from importlib.metadata import distribution, packages_distributions
from repo_paths import ROOT

PACKAGE_DIRS = ("broker", "backends", "jobs", "verify", "wallet")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!;~]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def _imported_distributions(paths) -> set[str]:
    """Distributions providing the modules these files import (stdlib and trainmaster left out)."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [f"{node.module}.{alias.name}" for alias in node.names]  # `from google.cloud import storage`
            else:
                continue
            for module in modules:
                if module.split(".")[0] not in set(sys.stdlib_module_names) | {"trainmaster"}:
                    found |= _providers(module)
    return found


def _providers(module: str) -> set[str]:
    """The installed distributions holding `module`'s files, or its top-level name when none is installed.
    A namespace shared by many distributions (google, azure) is resolved by the module's own path, so
    `google.cloud.storage` is google-cloud-storage and not every distribution with a `google/` folder."""
    top = module.split(".")[0]
    candidates = _top_level().get(top)
    if not candidates:
        return {top.lower().replace("_", "-")}
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = "/".join(parts[:depth])
        holders = {name for name in candidates if _holds(name, prefix)}
        if holders:
            return {name.lower().replace("_", "-") for name in holders}
    return {name.lower().replace("_", "-") for name in candidates}


@functools.cache
def _top_level() -> dict[str, list[str]]:
    return packages_distributions()


@functools.cache
def _files(distribution_name: str) -> frozenset[str]:
    return frozenset(str(f) for f in distribution(distribution_name).files or ())


def _holds(distribution_name: str, prefix: str) -> bool:
    return any(f.startswith(f"{prefix}/") or f == f"{prefix}.py" for f in _files(distribution_name))


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
                  if not any(d.startswith(f"{name}-") for d in declared)}  # google, azure: an extra not installed here
    # brought by the bittensor, aws and daemon extras (mlflow-skinny's client modules ship in mlflow-tracing)
    assert undeclared <= {"bittensor-core", "botocore", "mlflow-tracing"}, undeclared


def test_what_only_the_tests_use_is_in_dev():
    project = _project()
    core, dev = _names(project["dependencies"]), _names(project["optional-dependencies"]["dev"])
    tests_only = _imported_distributions((ROOT / "tests").rglob("*.py")) - _imported_distributions(_package_files())
    assert "safetensors" in tests_only and "safetensors" in dev and "safetensors" not in core
    assert "cryptography" not in core

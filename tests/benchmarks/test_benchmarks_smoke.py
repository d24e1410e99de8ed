"""A small run of every benchmark, so none of them rots; the real figures come from `./dev bench`."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from repo_paths import TESTS

BENCHMARKS = sorted((TESTS / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_smoke(path: Path, request):
    """The benchmark's own `run(smoke=True)`; the servers it names in SMOKE_FIXTURES come from the tests' fixtures
    (shared with the tests of its group: tests/conftest.py SHARED_GROUPS) instead of its own."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shared = {name: request.getfixturevalue(name) for name in getattr(module, "SMOKE_FIXTURES", ())}
    figures = module.run(smoke=True, **shared)
    assert figures, f"{path.name} reported no figures"
    for name, value in figures.items():
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{path.name}: {name} = {value!r}"

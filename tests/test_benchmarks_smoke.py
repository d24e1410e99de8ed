"""A small run of every benchmark, so none of them rots; the real figures come from `./dev bench`."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).parent / "benchmarks").glob("bench_*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_benchmark_smoke(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.run(smoke=True)
    assert figures, f"{path.name} reported no figures"
    for name, value in figures.items():
        assert isinstance(value, (int, float)) and math.isfinite(value), f"{path.name}: {name} = {value!r}"

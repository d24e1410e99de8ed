"""How `./dev test` spreads the suite (tests/conftest.py): a file's tests run on one worker, one after another (its
module-scoped fixtures set up once), each benchmark smoke run is a group of its own, the Ray tests and bench_ray's
smoke run share one group (one cluster), and the groups with the most slow tests go first."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import _group
from repo_paths import ROOT, TESTS


def test_the_groups():
    assert _group("tests/jobs/test_merkle.py::test_a[1]") == "tests/jobs/test_merkle.py"
    smoke = "tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke[bench_planner]"
    assert _group(smoke) == smoke
    assert _group("tests/benchmarks/test_benchmarks_smoke.py::test_benchmark_smoke[bench_ray]") == "ray"
    assert _group("tests/backends/ray/test_ray_backend.py::test_x") == "ray"
    assert _group("tests/backends/ray/test_ray_backend.py::test_x[a/b::c]") == "ray"


def test_a_parallel_run_keeps_each_files_tests_on_one_worker():
    """Two workers, three small files: each file's tests all on one worker (xdist's own loadgroup, under pytest 9,
    spread them one by one)."""
    files = [str(next(TESTS.rglob(name)).relative_to(ROOT)) for name in
             ("test_merkle.py", "test_wallet_rate_shown.py", "test_canonical.py")]
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p",
                           "no:cacheprovider", *files], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = re.findall(r"^\[(gw\d)\] \[ *\d+%\] PASSED (\S+?)::", done.stdout, re.M)
    workers = {file: {w for w, f in ran if f == file} for file in files}
    assert all(len(found) == 1 for found in workers.values()), workers
    assert len(ran) > 20

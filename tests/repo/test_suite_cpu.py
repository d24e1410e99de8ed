"""The suite's CPU account (tests/suite_cpu.py, printed by tests/benchmarks/bench_suite.py): each test's own CPU and
that of the children it waited for, recorded through tests/conftest.py when TRAINMASTER_SUITE_CPU is set."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import suite_cpu
from repo_paths import ROOT

BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"


def test_a_waited_childs_cpu_is_the_tests_and_not_the_workers_own(tmp_path):
    recorder = suite_cpu.Recorder(tmp_path)
    started = time.time()
    protocol = recorder.pytest_runtest_protocol(SimpleNamespace(nodeid="tests/x/test_y.py::test_z"), None)
    next(protocol)
    subprocess.run([sys.executable, "-c", BURN], check=True)
    with pytest.raises(StopIteration):
        next(protocol)
    [line] = suite_cpu.read(tmp_path)
    assert line["id"] == "tests/x/test_y.py::test_z"
    assert line["children_s"] >= 0.25 and line["self_s"] < line["children_s"], line
    assert line["wall_s"] >= 0.25
    assert started - 1 <= line["at"] <= started + 1, line  # the test's start, to line up with a load sampling


def test_every_test_of_a_run_is_recorded_once_when_the_variable_names_a_folder(tmp_path):
    folder = tmp_path / "cpu"
    env = {**os.environ, suite_cpu.ENV: str(folder)}
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "tests/repo/test_layout.py",
           f"--basetemp={tmp_path / 'basetemp'}"]
    done = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    collected = subprocess.run(run[:-1] + ["--collect-only"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    lines = suite_cpu.read(folder)
    assert sorted(line["id"] for line in lines) == sorted(ids) and ids
    assert all(line["self_s"] >= 0 and line["children_s"] >= 0 and line["wall_s"] > 0 for line in lines), lines
    untouched = subprocess.run(run, cwd=ROOT, env={k: v for k, v in env.items() if k != suite_cpu.ENV},
                               capture_output=True, text=True, timeout=300)
    assert untouched.returncode == 0 and len(suite_cpu.read(folder)) == len(lines)  # without it, nothing is recorded


def test_a_pytest_a_recorded_test_starts_records_nothing_twice(tmp_path):
    """The nested run's one test starts a process that reports whether it got the variable: it must not (the
    conftest drops it once the recorder is registered), and only that one test is recorded."""
    folder = tmp_path / "cpu"
    target = "tests/repo/test_suite_cpu.py::test_what_a_test_starts_does_not_get_the_variable"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", target,
                           f"--basetemp={tmp_path / 'basetemp'}"], cwd=ROOT, env={**os.environ, suite_cpu.ENV: str(folder)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [line["id"] for line in suite_cpu.read(folder)] == [target]


def test_what_a_test_starts_does_not_get_the_variable():
    """Run by the test above under a recorded session (elsewhere the variable is not set at all)."""
    seen = subprocess.run([sys.executable, "-c", f"import os; print(os.environ.get({suite_cpu.ENV!r}))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert seen == "None", seen


def test_the_machines_busy_seconds_only_grow():
    before = suite_cpu.machine_busy_s()
    exec(BURN)
    after = suite_cpu.machine_busy_s()
    assert before is not None and after - before >= 0.2

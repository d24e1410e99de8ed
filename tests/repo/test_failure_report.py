"""A failed test's report says what the machine was doing then (tests/machine_load.py, hooked in tests/conftest.py):
a timeout on a shared CI runner then tells a starved machine from a hang in the code under test."""

from __future__ import annotations

import os
import subprocess
import sys

from repo_paths import TESTS


def test_a_failure_report_ends_with_the_machines_load_and_busiest_processes(tmp_path):
    (tmp_path / "test_probe.py").write_text("def test_passes():\n    pass\n\ndef test_fails():\n    assert 1 == 2\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
                           "test_probe.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("the machine when it failed") == 1, done.stdout  # the failed test's only
    section = done.stdout.split("the machine when it failed", 1)[1]
    assert "load average" in section and f"on {len(os.sched_getaffinity(0))} cores" in section, section
    assert "running; the busiest over 0.5 s" in section and "GiB available" in section, section

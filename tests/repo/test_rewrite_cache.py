"""`./dev test` writes pytest's cache of rewritten test modules before the workers start (tests/rewrite_cache.py):
the cache it writes holds the header and code pytest writes itself, pytest runs from it with bytecode writing off,
its assert messages intact, and it primes the files pytest's settings here name as tests."""

from __future__ import annotations

import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rewrite_cache
from repo_paths import ROOT

SOURCE = '''
def double(x):
    return 2 * x


def test_double():
    assert double(2) == 4


def test_reported():
    values = [1, 2, 3]
    assert double(values[1]) == 5
'''


def _pytest(folder: Path, *, write: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTEST_ADDOPTS")}
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "-c",
                           os.devnull, "--rootdir", str(folder), str(folder)],
                          capture_output=True, text=True, cwd=folder, env=env, timeout=120)


def test_the_primed_cache_is_the_one_pytest_writes_and_pytest_runs_from_it(tmp_path):
    (tmp_path / "test_sample.py").write_text(SOURCE)
    cache = tmp_path / "__pycache__" / f"test_sample.{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"

    written = _pytest(tmp_path, write=True)  # pytest rewrites the file and caches it itself
    assert "1 failed, 1 passed" in written.stdout, written.stdout + written.stderr
    theirs = cache.read_bytes()
    cache.unlink()

    assert rewrite_cache.main([str(tmp_path)]) == 0
    ours = cache.read_bytes()
    assert ours[:16] == theirs[:16]  # magic number, flags (a checked hash) and the source's hash
    assert marshal.loads(ours[16:]) == marshal.loads(theirs[16:])  # the same rewritten code

    ran = _pytest(tmp_path, write=False)  # from the primed cache, writing nothing
    assert "1 failed, 1 passed" in ran.stdout, ran.stdout + ran.stderr
    assert "assert 4 == 5" in ran.stdout and "where 4 = double(2)" in ran.stdout, ran.stdout
    assert cache.read_bytes() == ours


def test_only_files_pytest_rewrites_are_primed_and_a_second_run_writes_nothing(tmp_path, capsys):
    (tmp_path / "sub").mkdir()
    for name in ("test_a.py", "b_test.py", "conftest.py", "sub/test_c.py", "support.py", "sub/helper.py"):
        (tmp_path / name).write_text("def test_x():\n    assert True\n")
    (tmp_path / "test_broken.py").write_text("def broken(:\n")  # pytest reports it when it collects it

    assert [p.relative_to(tmp_path).as_posix() for p in rewrite_cache.rewritten(tmp_path)] == [
        "b_test.py", "conftest.py", "sub/test_c.py", "test_a.py", "test_broken.py"]
    rewrite_cache.main([str(tmp_path)])
    assert "4 of 5 files rewritten" in capsys.readouterr().out
    rewrite_cache.main([str(tmp_path)])
    assert "0 of 5 files rewritten" in capsys.readouterr().out


def test_the_patterns_primed_are_the_suites_own_and_dev_test_primes_first():
    """rewrite_cache.py primes pytest's default test files; a `python_files` set in pyproject.toml would leave the
    files it names to each worker again."""
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "python_files" not in options
    dev = (ROOT / "dev").read_text()
    test_command = dev[dev.index("\n    test)"):dev.index(";;", dev.index("\n    test)"))]
    assert test_command.index("tests/rewrite_cache.py") < test_command.index('wait "$priming"') \
        < test_command.index("-m pytest")

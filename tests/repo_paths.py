"""Where the repository and its tests are, for a test in any folder under tests/ (test files mirror the package's
folders: tests/repo/test_layout.py)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
"""tests/: the helpers, the benchmarks, the fixtures' data."""
ROOT = TESTS.parent
"""The repository: the package's folders, docs/, configs/, pyproject.toml."""

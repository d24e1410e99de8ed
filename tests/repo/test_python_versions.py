"""The Pythons trainmaster runs on: what pyproject.toml's requires-python admits is what the code needs.

The floor is 3.10.12 / 3.11.4 (tarfile's extraction filters, PEP 706, extract every bundle: jobs/bundle.py); the
code itself must run on 3.10, checked statically by vermin (the suite runs on one Python only): the broker on the
Pythons pip installs it on, and the runtime (jobs/) in a cloud image whose Python is 3.10 (the default Vertex AI and
Azure ML images), where jobs/launcher_boot.py checks the same floor before the job starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from repo_paths import ROOT

from trainmaster.jobs import launcher_boot

PACKAGES = ("backends", "broker", "jobs", "verify", "wallet", "storage")


def test_requires_python_admits_exactly_the_pythons_with_extraction_filters():
    admitted = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    refused = ["3.9.18", "3.10.0", "3.10.11", "3.11.0", "3.11.2", "3.11.3"]  # 3.11.2: Debian 12's own
    assert [v for v in refused if Version(v) in admitted] == []
    assert all(Version(v) in admitted for v in ["3.10.12", "3.10.16", "3.11.4", "3.11.7", "3.12.0", "3.13.1"])
    assert launcher_boot.MIN_PYTHON == (3, 10)  # the images' floor is the same minor


def test_the_code_needs_nothing_newer_than_python_3_10():
    vermin = Path(sys.executable).with_name("vermin")
    done = subprocess.run([str(vermin), "--no-tips", "--eval-annotations", "--target=3.10-", "--violations",
                           *PACKAGES], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_dev_refuses_a_python_without_the_filters_before_making_anything(tmp_path):
    """`./dev demo` (the README's first command) with such a Python: one line saying what to use, no .venv made."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import tarfile\ndel tarfile.data_filter, tarfile.FilterError\n")
    old = tmp_path / "python3"  # this interpreter, as one that predates PEP 706
    old.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    old.chmod(0o755)
    venv = tmp_path / "venv"
    done = subprocess.run([str(ROOT / "dev"), "demo"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(old), "TRAINMASTER_VENV": str(venv)})
    assert done.returncode == 2, done.stdout + done.stderr
    # ./dev cannot import trainmaster before installing it: its text must say what jobs/launcher_boot.py says
    assert f"has no tarfile extraction filters (PEP 706): trainmaster needs Python {launcher_boot.FILTERS_PYTHONS}" \
        in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not venv.exists()


def test_dev_test_in_a_fresh_checkout_refuses_such_a_python_before_starting_npm(tmp_path):
    """`./dev test` starts Azurite's `npm ci` beside the Python install: with such a Python it still refuses first,
    with the same line, and starts nothing (no .venv, no npm)."""
    checkout = tmp_path / "checkout"  # what ./dev reads before it installs: no node_modules, no .venv yet
    for name in ("dev", "pyproject.toml", "constraints-dev.txt", "tests/azurite/package-lock.json"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_bytes((ROOT / name).read_bytes())
    (checkout / "dev").chmod(0o755)
    site, tools = tmp_path / "site", tmp_path / "bin"
    site.mkdir()
    tools.mkdir()
    (site / "sitecustomize.py").write_text("import tarfile\ndel tarfile.data_filter, tarfile.FilterError\n")
    old = tools / "python3"
    old.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    npm = tools / "npm"  # records being run
    npm.write_text(f"#!/bin/sh\ntouch {tmp_path / 'npm-ran'}\n")
    for tool in (old, npm):
        tool.chmod(0o755)
    done = subprocess.run([str(checkout / "dev"), "test"], cwd=checkout, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(old), "PATH": f"{tools}:{os.environ['PATH']}",
                               "TRAINMASTER_VENV": str(checkout / ".venv")})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "has no tarfile extraction filters (PEP 706)" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (checkout / ".venv").exists() and not (tmp_path / "npm-ran").exists()

"""The "image" the cloud runners start containers from: a Python with torch and numpy, and nothing of trainmaster.

A stock PyTorch training image has a Python, torch (with what torch requires) and numpy; it has no trainmaster,
and trainmaster is not on PyPI, so what the job needs of trainmaster must come with the job (the runtime pack
and the boot script, backends/managed/runtime_pack.py). This builds that image once per test session: a venv
(`python -m venv --without-pip`, no system site-packages) whose site-packages links torch's distributions, the
ones torch requires, and numpy's, from the test's own environment. Nothing else is there: no pydantic, no PyYAML,
no trainmaster, not even pip. `IMAGE` is the name the tests configure as the backends' `image`; the runners
refuse to start any other (a registry that does not have the image).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

IMAGE = "registry.test/pytorch-training:cpu-py311"
"""The test image's name: what backends.yaml names as `image` in the cloud tests."""
STOCK = ("torch", "numpy")
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


@dataclass(frozen=True)
class Container:
    root: Path
    python: Path

    def env(self, scratch: Path) -> dict[str, str]:
        """A container's base environment: its PATH and a home and temp dir of its own, nothing of the host's."""
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "home").mkdir(exist_ok=True)
        (scratch / "tmp").mkdir(exist_ok=True)
        return {"PATH": f"{self.root / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(scratch / "home"),
                "TMPDIR": str(scratch / "tmp"), "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}

    def argv(self, command: list[str]) -> list[str]:
        """`command` as the image runs it: `python` and `python3` are the image's Python."""
        return [str(self.python) if word in ("python", "python3") and i == 0 else word for i, word in enumerate(command)]


def _name(requirement: str) -> str | None:
    if ";" in requirement and "extra ==" in requirement:
        return None
    return re.split(r"[\s<>=!~\[(;]", requirement.strip(), maxsplit=1)[0]


def closure(names: tuple[str, ...]) -> list[str]:
    found, todo = [], list(names)
    while todo:
        name = todo.pop(0)
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        found.append(key)
        todo += [n for n in map(_name, requires) if n]
    return found


def _top_levels(distribution: str) -> set[str]:
    """The names a distribution puts in site-packages (packages, modules, its dist-info, its .libs folder)."""
    tops = set()
    for entry in metadata.distribution(distribution).files or []:
        parts = PurePosixPath(str(entry)).parts
        if parts and parts[0] not in ("..", "__pycache__"):
            tops.add(parts[0])
    return tops


def build(folder: Path) -> Container:
    """The image, made in `folder` (a few hundred links: well under a second)."""
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
    here = Path(sysconfig.get_path("purelib"))
    for distribution in closure(STOCK):
        for top in _top_levels(distribution):
            if (here / top).exists() and not (site / top).exists():
                os.symlink(here / top, site / top)
    python = folder / "bin" / "python"
    found = subprocess.run([str(python), "-c", "import importlib.util as u; print([m for m in ('trainmaster', "
                            "'pydantic', 'yaml') if u.find_spec(m)])"], capture_output=True, text=True,
                           env={"PATH": "/usr/bin:/bin"}, check=True)
    if found.stdout.strip() != "[]":
        raise RuntimeError(f"the test image at {folder} sees {found.stdout.strip()}: it must have torch only")
    return Container(root=folder, python=python)


_shared: Container | None = None


def shared() -> Container:
    """The session's image, built on first use (every cloud's tests run containers from the same one)."""
    global _shared
    if _shared is None:
        import atexit
        import shutil
        import tempfile

        folder = Path(tempfile.mkdtemp(prefix="tm-image-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        _shared = build(folder / "image")
    return _shared

"""What a managed job's container needs of trainmaster, packed once: `runtime.zip`, shipped with the job's input.

No image has trainmaster installed and trainmaster is not on PyPI; installing it there with pip would also
replace the image's torch (trainmaster's own requirements pin a newer one). So the backend ships what the
container runs, and the container's boot script (jobs/launcher_boot.py) puts it on the path, installing nothing:

* `site/trainmaster/jobs/…`: the installed `trainmaster.jobs` package as it is here (the launcher, the runtime,
  the recipes: everything that runs in a job imports only `jobs`, by the layering rule);
* `deps/…`: pydantic and what it requires (pydantic-core, typing-extensions, annotated-types,
  typing-inspection), which the runtime imports and stock PyTorch images do not reliably carry. All pure Python
  but pydantic-core, a compiled extension built for one Python: it is this interpreter's own files when the
  image's Python (`image_python`) is this one's, else a wheel for the image's Python (the `runtime_wheels`
  folder, filled once by `pip download` when it lacks one); the boot script uses the image's own pydantic
  instead when it has a version trainmaster accepts;
* `fallback/…`: PyYAML's pure-Python package, used only when the image has no PyYAML;
* `runtime.json`: the pack's sha256, what it was built for and the pydantic versions trainmaster accepts.

torch and numpy never travel: the image's are used, after the boot script checked them. The zip is
deterministic (sorted entries, fixed times), so the same installation gives the same bytes and the store keeps
it once under its sha256 (`runtime/<sha256>.zip`), like a bundle.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as metadata
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from trainmaster.backends.base import ConfigurationError
from trainmaster.jobs.launcher_boot import PACK, PLAN, SETUP

BOOT = "boot.py"
"""The boot script's name in the job's input folder (jobs/launcher_boot.py, shipped as it is)."""
__all__ = ["BOOT", "PACK", "PLAN", "SETUP", "RuntimePack", "build", "boot_script", "cache_dir"]

PACKAGE = "trainmaster.jobs"
BINARY = "pydantic-core"
FALLBACK = ("PyYAML",)
STAMP = (2020, 1, 1, 0, 0, 0)
SKIPPED_PARTS = {"__pycache__"}
SKIPPED_SUFFIXES = (".pyc", ".pyo")
PIP_TIMEOUT_S = 300


@dataclass(frozen=True)
class RuntimePack:
    path: Path
    sha256: str
    size: int
    python: str
    """The Python (major.minor) its pydantic-core was packed for."""


def this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _requirement_name(text: str) -> str | None:
    """The distribution a requirement names, None for one under an extra or a marker (not installed for us)."""
    if ";" in text:
        return None
    return re.split(r"[\s<>=!~\[(]", text.strip(), maxsplit=1)[0]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dependencies() -> list[str]:
    """pydantic and the distributions it requires, recursively (extras left out), in a stable order."""
    found, todo = [], ["pydantic"]
    while todo:
        name = todo.pop(0)
        if _normal(name) in map(_normal, found):
            continue
        found.append(name)
        todo += [n for n in map(_requirement_name, metadata.requires(name) or []) if n]
    return found


def _pydantic_range() -> tuple[list[int], list[int]]:
    """The pydantic versions trainmaster accepts ([2, 6] to below [3]), from its own requirement."""
    try:
        wanted = next(r for r in metadata.requires("trainmaster") or [] if _requirement_name(r) == "pydantic")
    except (metadata.PackageNotFoundError, StopIteration):
        return [2, 6], [3]
    low = re.search(r">=\s*([\d.]+)", wanted)
    high = re.search(r"<\s*([\d.]+)", wanted)
    to = lambda m, d: [int(x) for x in m.group(1).split(".")] if m else d  # noqa: E731
    return to(low, [2, 6]), to(high, [3])


def _installed_files(distribution: str) -> list[tuple[str, Path]]:
    """(path in site-packages, file) of every file of an installed distribution, compiled files left out."""
    dist = metadata.distribution(distribution)
    files = []
    for entry in dist.files or []:
        parts = PurePosixPath(str(entry)).parts
        if ".." in parts or SKIPPED_PARTS & set(parts) or str(entry).endswith(SKIPPED_SUFFIXES):
            continue
        if parts and parts[0].endswith(".dist-info") and parts[-1] in ("RECORD", "INSTALLER", "REQUESTED",
                                                                         "direct_url.json"):
            continue
        located = Path(dist.locate_file(entry))
        if located.is_file():
            files.append((PurePosixPath(*parts).as_posix(), located))
    return files


def _package_files() -> list[tuple[str, Path]]:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(f"{PACKAGE} is not installed here, so it cannot be shipped")
    root = Path(list(spec.submodule_search_locations)[0])
    files = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not SKIPPED_PARTS & set(rel.parts) and not path.name.endswith(SKIPPED_SUFFIXES):
            files.append(("trainmaster/jobs/" + rel.as_posix(), path))
    return files


def _wheel_members(wheel: Path) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(wheel) as archive:
        return [(info.filename, archive.read(info)) for info in archive.infolist()
                if not info.is_dir() and not info.filename.endswith("/RECORD")]


def _wheel_tag(python: str) -> str:
    return "cp" + python.replace(".", "")


def find_wheel(folder: Path, version: str, python: str, machine: str) -> Path | None:
    """A pydantic-core wheel of `version` for CPython `python` on manylinux `machine` in `folder`, if any."""
    tag = _wheel_tag(python)
    pattern = re.compile(rf"pydantic_core-{re.escape(version)}-{tag}-{tag}-[^/]*(manylinux|linux)[^/]*_{machine}[^/]*\.whl")
    found = sorted(p for p in folder.glob("pydantic_core-*.whl") if pattern.fullmatch(p.name)) if folder.is_dir() else []
    return found[-1] if found else None


def fetch_wheel(folder: Path, version: str, python: str, machine: str) -> Path:
    """The pydantic-core wheel for the image's Python: from `folder`, else downloaded into it with pip (once)."""
    found = find_wheel(folder, version, python, machine)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
            "--implementation", "cp", "--python-version", python, "--platform", f"manylinux2014_{machine}",
            "--platform", f"manylinux_2_17_{machine}", "--platform", f"manylinux_2_28_{machine}",
            "--dest", str(folder), f"pydantic-core=={version}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        done = None
        said = str(exc)
    else:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        said = said[0]
    found = find_wheel(folder, version, python, machine)
    if found is None:
        raise ConfigurationError(
            f"the image's Python is {python}, not this interpreter's {this_python()}, so pydantic-core "
            f"{version} must be shipped as a wheel built for Python {python} ({machine}); none is in {folder} and "
            f"`pip download` could not get one ({said or 'no answer'}). Put "
            f"pydantic_core-{version}-{_wheel_tag(python)}-…-manylinux…_{machine}.whl there, or set image_python "
            "to the image's real Python")
    return found


def _digest(members: list[tuple[str, bytes]]) -> str:
    digest = hashlib.sha256()
    for name, data in members:
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()


def _suffixes(members: list[tuple[str, bytes]]) -> list[str]:
    """The extension-module suffixes (`.cpython-311-x86_64-linux-gnu.so`) of pydantic-core's compiled files."""
    found = set()
    for name, _ in members:
        match = re.fullmatch(r"deps/pydantic_core/_pydantic_core(\.[^/]+\.(so|pyd))", name)
        if match:
            found.add(match.group(1))
    return sorted(found)


def _sources(python: str, machine: str, wheels: Path | None, cache: Path) -> list[tuple[str, Path]]:
    """(name in the pack, file) of everything the pack holds, without reading any of it."""
    found = [("site/" + name, path) for name, path in _package_files()]
    for distribution in dependencies():
        if _normal(distribution) == BINARY and python != this_python():
            wheel = fetch_wheel(wheels or cache / "wheels", metadata.version(BINARY), python, machine)
            found.append(("wheel", wheel))
        else:
            found += [("deps/" + name, path) for name, path in _installed_files(distribution)]
    for distribution in FALLBACK:
        found += [("fallback/" + name, path) for name, path in _installed_files(distribution)
                  if not re.search(r"\.(so|pyd)$", name)]  # PyYAML's pure-Python half runs on any Python
    return found


def _fingerprint(sources: list[tuple[str, Path]], python: str, machine: str) -> str:
    """What the pack is made of, by name, size and modification time: the same fingerprint, the same pack."""
    digest = hashlib.sha256(f"{python}\0{machine}".encode())
    for name, path in sorted(sources, key=lambda item: item[0]):
        stat = path.stat()
        digest.update(f"{name}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def build(cache: Path, python: str | None = None, machine: str = "x86_64", wheels: Path | None = None) -> RuntimePack:
    """The pack for an image whose Python is `python` (default: this interpreter's), written under `cache`. A pack
    built before from the same files (their names, sizes and times: `_fingerprint`) is reused without reading them."""
    python = python or this_python()
    sources = _sources(python, machine, wheels, cache)
    known = cache / f"pack-{_fingerprint(sources, python, machine)}.json"
    try:
        found = json.loads(known.read_text())
        path = Path(found["path"])
        if path.is_file() and path.stat().st_size == found["size"]:
            return RuntimePack(path=path, sha256=found["sha256"], size=found["size"], python=python)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    members: list[tuple[str, bytes]] = []
    for name, path in sources:
        if name == "wheel":
            members += [("deps/" + member, data) for member, data in _wheel_members(path)]
        else:
            members.append((name, path.read_bytes()))
    members.sort()
    low, below = _pydantic_range()
    sha256 = _digest(members)
    info = {"sha256": sha256, "python": python, "machine": machine, "binary_suffixes": _suffixes(members),
            "pydantic": low, "pydantic_below": below,
            "dependencies": {d: metadata.version(d) for d in dependencies() + list(FALLBACK)}}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as archive:
        for name, data in [("runtime.json", json.dumps(info, sort_keys=True).encode()), *members]:
            entry = zipfile.ZipInfo(name, STAMP)
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, data)
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"runtime-{digest}.zip"
    if not path.is_file():
        _write_atomic(path, data)
    _write_atomic(known, json.dumps({"path": str(path), "sha256": digest, "size": len(data)}).encode())
    return RuntimePack(path=path, sha256=digest, size=len(data), python=python)


def _write_atomic(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + f".{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def boot_script() -> bytes:
    """The container's first script (jobs/launcher_boot.py), shipped as `boot.py`."""
    spec = importlib.util.find_spec("trainmaster.jobs.launcher_boot")
    return Path(spec.origin).read_bytes()


def cache_dir() -> Path:
    """Where packs and downloaded wheels are kept on this machine (the user's cache dir)."""
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("trainmaster")) / "runtime"


def extension_suffix() -> str:
    return sysconfig.get_config_var("EXT_SUFFIX") or ""

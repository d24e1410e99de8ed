"""The container's boot script (jobs/launcher_boot.py) and the runtime pack it unpacks (backends/managed/runtime_pack.py),
run in images made for the test (clouds/container.py: a Python with torch and numpy, no trainmaster): trainmaster
reaches the container with the job and runs without anything installed into the image's Python; an image it
cannot run on (no torch, an old torch, a Python the packed pydantic-core was not built for, a failing setup) is
refused before the job starts, the reason on stderr and in the synced folder's exit record."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from clouds.container import Container, closure, shared
from launcher_support import make_bundle, plan, read_json
from trainmaster.backends.base import ConfigurationError
from trainmaster.backends.managed import runtime_pack
from trainmaster.jobs import launcher_boot

SHOW = ("import json, os, sys, importlib.util as u\n"
        "print(json.dumps({'path': os.environ.get('PYTHONPATH', ''), 'yaml': u.find_spec('yaml').origin,"
        " 'pydantic': u.find_spec('pydantic').origin}))\n")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return runtime_pack.build(tmp_path_factory.mktemp("cache"))


def _image(folder: Path, *distributions: str) -> Container:
    """A Python venv with only `distributions` (and what they require) linked in: another image kind."""
    import importlib.metadata as metadata
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(folder), "platbase": str(folder)}))
    here = Path(sysconfig.get_path("purelib"))
    for distribution in closure(distributions) if distributions else []:
        for entry in metadata.distribution(distribution).files or []:
            top = Path(str(entry)).parts[0]
            if top not in ("..", "__pycache__") and (here / top).exists() and not (site / top).exists():
                os.symlink(here / top, site / top)
    return Container(root=folder, python=folder / "bin" / "python")


def _fake_torch(image: Container, version: str) -> None:
    import sysconfig

    site = Path(sysconfig.get_path("purelib", vars={"base": str(image.root), "platbase": str(image.root)}))
    info = site / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")


def _boot(tmp_path: Path, image: Container, pack_path: Path, entrypoint: str, files: dict | None = None,
          setup: str | None = None) -> tuple[subprocess.CompletedProcess, Path]:
    """The job's input folder as a managed backend leaves it, run as Azure ML runs `python3 <input>/boot.py`."""
    bundle, digest = make_bundle(tmp_path / "in", files or {}, entrypoint)
    inputs = tmp_path / "input"
    inputs.mkdir()
    (inputs / "boot.py").write_bytes(runtime_pack.boot_script())
    shutil.copyfile(pack_path, inputs / "runtime.zip")
    (inputs / "launch.json").write_text(plan("azureml", entrypoint, digest))
    if setup is not None:
        (inputs / "setup.sh").write_text(setup)
    sync = tmp_path / "sync"
    env = {**image.env(tmp_path / "container"), "AZURE_ML_INPUT_bundle": str(bundle),
           "AZURE_ML_OUTPUT_sync": str(sync)}
    done = subprocess.run(image.argv(["python3", str(inputs / "boot.py")]), env=env, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)
    return done, sync


def test_trainmaster_runs_in_an_image_that_has_only_torch(tmp_path, pack):
    image = shared()
    done, sync = _boot(tmp_path, image, pack.path, "python show.py", {"show.py": SHOW})
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    runtime = Path(seen["path"].split(os.pathsep)[0]).parent
    assert seen["pydantic"].startswith(str(runtime / "deps"))  # the pack's: the image has none
    assert seen["yaml"].startswith(str(runtime / "fallback"))  # the pack's pure-Python PyYAML
    assert read_json(sync / "exit.json")["exit_code"] == 0
    check = subprocess.run([str(image.python), "-c", "import pydantic"], capture_output=True, text=True,
                           env=image.env(tmp_path / "after"))
    assert check.returncode != 0  # nothing was installed into the image's Python


def test_an_image_with_its_own_pydantic_keeps_it(tmp_path, pack):
    image = _image(tmp_path / "image", "torch", "pydantic", "PyYAML")
    done, _ = _boot(tmp_path, image, pack.path, "python show.py", {"show.py": SHOW})
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
    assert "/deps" not in seen["path"] and "/fallback" not in seen["path"]
    assert seen["pydantic"].startswith(str(image.root)) and seen["yaml"].startswith(str(image.root))


@pytest.mark.parametrize("torch_version, said", [
    (None, "the image has no torch"),
    ("1.13.1", "the image's torch 1.13.1 is older than 2.0"),
])
def test_an_image_trainmaster_cannot_run_on_is_refused_with_the_reason(tmp_path, pack, torch_version, said):
    image = _image(tmp_path / "image")
    if torch_version:
        _fake_torch(image, torch_version)
    done, sync = _boot(tmp_path, image, pack.path, "python -c 'print(1)'")
    assert done.returncode == 2
    assert said in done.stderr
    ended = read_json(sync / "exit.json")
    assert ended["exit_code"] == 2 and said in ended["reason"]  # what the broker shows as the attempt's reason
    assert read_json(sync / "outputs.json") == {"files": {}}


def test_a_pydantic_core_for_another_python_is_refused_naming_the_setting(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, "3.10")
    other = runtime_pack.build(tmp_path / "cache", "3.10", "x86_64", wheels)
    done, sync = _boot(tmp_path, shared(), other.path, "python -c 'print(1)'")
    assert done.returncode == 2
    assert "cannot load the pydantic-core trainmaster packed for .cpython-310-x86_64-linux-gnu.so" in done.stderr
    assert "image_python" in read_json(sync / "exit.json")["reason"]


def test_the_setup_runs_first_and_a_failing_one_stops_the_launch(tmp_path, pack):
    ok = tmp_path / "ok"
    ok.mkdir()
    marker = ok / "setup-ran"
    done, _ = _boot(ok, shared(), pack.path, f"python -c \"print(open('{marker}').read())\"", setup=f"echo set > {marker}\n")
    assert done.returncode == 0 and "set" in done.stdout, done.stdout + done.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    done, sync = _boot(bad, shared(), pack.path, "python -c 'print(1)'", setup="exit 7\n")
    assert done.returncode == 2 and "the setup (the backend's `setup` setting) exited with code 7" in done.stderr
    assert read_json(sync / "exit.json")["exit_code"] == 2


def test_an_old_python_is_refused_with_the_reason():
    with pytest.raises(launcher_boot.Refused, match="Python 3.8 is older than 3.10"):
        launcher_boot.check_python((3, 8, 10))
    launcher_boot.check_python((3, 12, 1))
    # an image's Python before tarfile's extraction filters (PEP 706) could not extract the job's code
    with pytest.raises(launcher_boot.Refused, match=r"Python 3\.10\.8 has no tarfile extraction filters \(PEP 706\).*"
                                                    r"3\.10\.12\+, 3\.11\.4\+ or 3\.12\+"):
        launcher_boot.check_python((3, 10, 8), filters=False)
    launcher_boot.check_python((3, 11, 4), filters=True)
    assert launcher_boot._numbers("2.5.1+cu121") == (2, 5, 1) and launcher_boot._numbers("2.6.0a0") == (2, 6, 0)


def _fake_wheel(folder: Path, python: str) -> Path:
    """A pydantic-core wheel for another Python (its files are never loaded here)."""
    import importlib.metadata as metadata

    tag = "cp" + python.replace(".", "")
    version = metadata.version("pydantic-core")
    path = folder / f"pydantic_core-{version}-{tag}-{tag}-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("pydantic_core/__init__.py", "")
        wheel.writestr(f"pydantic_core/_pydantic_core.cpython-{tag[2:]}-x86_64-linux-gnu.so", b"\0")
        wheel.writestr(f"pydantic_core-{version}.dist-info/METADATA", f"Name: pydantic-core\nVersion: {version}\n")
    return path


def test_the_pack_holds_trainmaster_and_what_its_runtime_imports_never_torch(pack):
    with zipfile.ZipFile(pack.path) as archive:
        names = archive.namelist()
        info = json.loads(archive.read("runtime.json"))
    assert "site/trainmaster/jobs/launcher.py" in names and "site/trainmaster/jobs/runtime.py" in names
    assert any(n.startswith("deps/pydantic/") for n in names) and any(n.startswith("deps/pydantic_core/") for n in names)
    assert any(n.startswith("fallback/yaml/") for n in names)
    assert not any(n.split("/")[1] in ("torch", "numpy") for n in names if n.count("/") > 1)
    assert not any(n.endswith((".pyc", "RECORD")) for n in names)
    assert info["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert info["binary_suffixes"] and info["pydantic"] == [2, 6] and info["pydantic_below"] == [3]


def test_the_pack_is_the_same_bytes_each_time(tmp_path, pack):
    again = runtime_pack.build.__wrapped__(tmp_path / "other-cache")
    assert again.sha256 == pack.sha256 and again.size == pack.size


def test_another_pythons_pydantic_core_comes_from_the_wheel_folder(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, "3.12")
    other = runtime_pack.build(tmp_path / "cache", "3.12", "x86_64", wheels)
    with zipfile.ZipFile(other.path) as archive:
        info = json.loads(archive.read("runtime.json"))
        assert "deps/pydantic_core/_pydantic_core.cpython-312-x86_64-linux-gnu.so" in archive.namelist()
    assert info["python"] == "3.12" and info["binary_suffixes"] == [".cpython-312-x86_64-linux-gnu.so"]


def test_without_a_wheel_for_the_images_python_the_submit_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # pip finds nothing (no network in tests either way)
    with pytest.raises(ConfigurationError) as caught:
        runtime_pack.build(tmp_path / "cache", "3.9", "aarch64", tmp_path / "empty")
    said = str(caught.value)
    assert "pydantic-core" in said and "Python 3.9" in said and str(tmp_path / "empty") in said
    assert "image_python" in said

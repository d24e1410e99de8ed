"""What a managed service's container runs first: `python3 <the job's input>/boot.py` (this file, shipped as it is).

No image has trainmaster installed and trainmaster is not on PyPI, so the managed backend puts three files in
the job's input (SageMaker's `trainmaster` channel, the attempt's `input/` folder read through Vertex AI's
/gcs mount, Azure ML's `trainmaster` input): this script, `launch.json` (the launch plan, jobs/launch_plan.py)
and `runtime.zip` (backends/managed/runtime_pack.py: trainmaster's `jobs` package and the pure-Python and
binary dependencies it imports that a stock PyTorch image may lack). It

1. checks the image: its Python (3.10 or newer, with tarfile's extraction filters: 3.10.12+, 3.11.4+) and its
   torch (installed, 2.0 or newer), never touching either: nothing is installed into the image's Python;
2. unpacks `runtime.zip` into a fresh folder of the temp dir and puts trainmaster's package first on the
   path; pydantic (with pydantic-core, built for one Python) comes from the pack unless the image has a
   pydantic 2 that trainmaster accepts; PyYAML from the image when it has one, else the pack's (pure Python);
3. runs `setup.sh` of the input (the backend's `setup` setting) with bash, when there is one;
4. replaces itself with `python -m trainmaster.jobs.launcher` (the same process: the service's signals reach
   the launcher), the plan named by TRAINMASTER_LAUNCH_FILE.

A check that fails exits 2 with the reason on stderr, in the synced folder's exit record where the service
names that folder (`exit.json`, what the broker reports) and, on SageMaker, in /opt/ml/output/failure (its
FailureReason). Standard library only, and no syntax newer than Python 3.6, so an image with an old Python
hears why it cannot run rather than a SyntaxError.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

REFUSED = 2
MIN_PYTHON = (3, 10)
FILTERS_PYTHONS = "3.10.12+, 3.11.4+ or 3.12+"
"""The Pythons with tarfile's extraction filters (PEP 706), which every bundle is extracted with (jobs/bundle.py)."""
MIN_TORCH = (2, 0)
"""The runtime and its recipes use torch 2 APIs (scaled_dot_product_attention, the foreach optimizer ops)."""
PACK = "runtime.zip"
PLAN = "launch.json"
SETUP = "setup.sh"
LAUNCH_FILE = "TRAINMASTER_LAUNCH_FILE"
GCS_MOUNT = "TRAINMASTER_GCS_MOUNT"
PREFIX = "[trainmaster]"


class Refused(Exception):
    pass


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    started = time.time()
    try:
        plan = _plan(os.path.join(here, PLAN))
    except Refused as exc:
        return _refuse(str(exc), None, started)
    try:
        check_python(sys.version_info)
        check_torch(_version("torch"))
        root = unpack(os.path.join(here, PACK))
        path = search_path(root)
        run_setup(os.path.join(here, SETUP))
    except Refused as exc:
        return _refuse(str(exc), plan, started)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env[LAUNCH_FILE] = os.path.join(here, PLAN)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "trainmaster.jobs.launcher"], env)


def _plan(path):
    try:
        with open(path) as handle:
            plan = json.load(handle)
    except (OSError, ValueError) as exc:
        raise Refused("the launch plan %s cannot be read: %s" % (path, exc))
    if not isinstance(plan, dict):
        raise Refused("the launch plan %s is not a JSON object" % path)
    return plan


def _numbers(text):
    """(2, 5, 1) of "2.5.1+cu121"; () when it does not start with a number."""
    found = []
    for part in text.split("+")[0].split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        found.append(int(digits))
        if digits != part:
            break
    return tuple(found)


def _version(distribution):
    """The installed version of a distribution of the image's Python, None when it has none (not imported)."""
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8: check_python has refused it already
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def check_python(version, filters=None):
    """`filters`: whether tarfile has its extraction filters (PEP 706: 3.12, backported to 3.10.12 and 3.11.4),
    which the launcher extracts the job's code with (this Python's, when not given)."""
    if tuple(version[:2]) < MIN_PYTHON:
        raise Refused("the image's Python %d.%d is older than %d.%d, which the trainmaster runtime needs; use an "
                      "image with a newer Python" % (version[0], version[1], MIN_PYTHON[0], MIN_PYTHON[1]))
    if not (hasattr(tarfile, "data_filter") if filters is None else filters):
        raise Refused("the image's Python %d.%d.%d has no tarfile extraction filters (PEP 706), which the trainmaster "
                      "runtime extracts the job's code with: it needs Python %s; use an image with a newer Python"
                      % (tuple(version[:3]) + (FILTERS_PYTHONS,)))


def check_torch(version):
    if version is None:
        raise Refused("the image has no torch (the trainmaster runtime runs on the image's own torch, %d.%d or "
                      "newer, and never installs one); use a PyTorch image" % MIN_TORCH)
    if _numbers(version)[:2] < MIN_TORCH:
        raise Refused("the image's torch %s is older than %d.%d, which the trainmaster runtime needs; use an image "
                      "with a newer PyTorch" % ((version,) + MIN_TORCH))


def unpack(pack):
    """The pack unpacked in a folder of the temp dir (unpacked once per pack on this machine): its root."""
    try:
        archive = zipfile.ZipFile(pack)
    except (OSError, zipfile.BadZipFile) as exc:
        raise Refused("the trainmaster runtime %s cannot be read: %s" % (pack, exc))
    with archive:
        try:
            info = json.loads(archive.read("runtime.json").decode())
        except (KeyError, ValueError) as exc:
            raise Refused("the trainmaster runtime %s has no readable runtime.json: %s" % (pack, exc))
        root = os.path.join(tempfile.gettempdir(), "trainmaster-runtime-" + str(info.get("sha256", "x"))[:16])
        if os.path.isfile(os.path.join(root, "runtime.json")):
            return root
        partial = tempfile.mkdtemp(prefix=".trainmaster-runtime-", dir=tempfile.gettempdir())
        for member in archive.infolist():
            target = os.path.realpath(os.path.join(partial, member.filename))
            if not target.startswith(os.path.realpath(partial) + os.sep):
                raise Refused("the trainmaster runtime holds a path outside its folder: %r" % member.filename)
        archive.extractall(partial)
    try:
        os.rename(partial, root)
    except OSError:  # another process of this machine unpacked it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    return root


def search_path(root):
    """The folders to put first on the path: trainmaster's package, then the pack's dependencies the image lacks
    (or has in a version trainmaster does not take)."""
    with open(os.path.join(root, "runtime.json")) as handle:
        info = json.load(handle)
    path = [os.path.join(root, "site")]
    pydantic = _version("pydantic")
    lowest, below = tuple(info.get("pydantic", [2, 6])), tuple(info.get("pydantic_below", [3]))
    if not (pydantic and lowest <= _numbers(pydantic) < below and _version("pydantic-core")):
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ""
        shipped = info.get("binary_suffixes", [])
        if suffix not in shipped:
            raise Refused("the image's Python %d.%d (%s) cannot load the pydantic-core trainmaster packed for %s; "
                          "set image_python to the image's Python version in backends.yaml (or use an image "
                          "with pydantic %s)" % (sys.version_info[0], sys.version_info[1], suffix or "?",
                                                  ", ".join(shipped) or "no Python",
                                                  ".".join(map(str, lowest)) + " or newer"))
        path.append(os.path.join(root, "deps"))
    if _version("PyYAML") is None:
        path.append(os.path.join(root, "fallback"))
    return path


def run_setup(script):
    if not os.path.isfile(script):
        return
    print("%s running the setup (setup.sh)" % PREFIX, flush=True)
    done = subprocess.call(["bash", "-e", script], stdin=subprocess.DEVNULL)
    if done != 0:
        raise Refused("the setup (the backend's `setup` setting) exited with code %d" % done)


def _refuse(reason, plan, started):
    print("%s cannot launch: %s" % (PREFIX, reason), file=sys.stderr, flush=True)
    sync = _synced_folder(plan) if plan is not None else None
    if sync:
        record = {"exit_code": REFUSED, "reason": reason, "started_at": started, "ended_at": time.time()}
        try:
            os.makedirs(sync, exist_ok=True)
            for name, data in (("outputs.json", {"files": {}}), ("exit.json", record)):
                with open(os.path.join(sync, name), "w") as handle:
                    json.dump(data, handle)
        except OSError:
            pass
    if plan is not None and plan.get("service") == "sagemaker":
        try:
            with open("/opt/ml/output/failure", "w") as handle:
                handle.write(reason[:1000])
        except OSError:
            pass
    return REFUSED


def _synced_folder(plan):
    """Where the launcher would keep the synced folder (jobs/services.py), from the plan and the service's variables."""
    service, sync = plan.get("service"), plan.get("sync") or ""
    if sync:
        return sync
    if service == "sagemaker":
        return "/opt/ml/checkpoints"
    if service == "vertex":
        found = os.environ.get("AIP_CHECKPOINT_DIR", "")
        if found.startswith("gs://"):
            return os.path.join(os.environ.get(GCS_MOUNT, "/gcs"), found[len("gs://"):])
        return found or None
    if service == "azureml":
        return os.environ.get("AZURE_ML_OUTPUT_sync")
    return None


if __name__ == "__main__":
    sys.exit(main())

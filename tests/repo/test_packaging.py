"""The package layout docs/architecture.md §1 describes: folders mapped into the `trainmaster` namespace, all listed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from repo_paths import ROOT



def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    cfg = pyproject()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for init in ROOT.glob("*/**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[0] in ("tests", ".venv", "build") or "node_modules" in rel.parts:
            continue
        top = rel.parts[0]
        assert f"trainmaster.{top}" in mapping, f"{top}/ is not mapped in package-dir"
        found.add(".".join(["trainmaster", *rel.parts]))
    assert found == listed, f"missing from packages: {found - listed}; listed but absent: {listed - found}"


def test_nothing_importable_under_bare_names():
    out = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; print([n for n in ('broker','backends','jobs','wallet','verify','storage') if u.find_spec(n)])"],
        capture_output=True, text=True, cwd="/", check=True,
    )
    assert out.stdout.strip() == "[]"


def test_help_imports_no_torch_and_no_cloud_sdk():
    code = (
        "import sys\n"
        "from trainmaster.broker.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('torch', 'boto3', 'google.cloud.aiplatform', 'azure.ai.ml', 'bittensor', 'pydantic') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY []" in out.stdout, out.stdout


def test_configs_ship_as_package_data():
    from importlib import resources

    files = {p.name for p in resources.files("trainmaster.configs").iterdir()}
    assert "default.yaml" in files
    assert (resources.files("trainmaster.configs") / "examples" / "demo" / "job.yaml").is_file()


def test_the_shipped_calibrations_are_package_data():
    assert "calibrations/*.json" in pyproject()["tool"]["setuptools"]["package-data"]["trainmaster.verify"]
    from trainmaster.verify.calibration import shipped_calibration_dir

    shipped = sorted(p.name for p in shipped_calibration_dir().glob("*.json"))
    pairs = {(name.split("-")[0], name.split(".")[1] if name.count(".") == 2 else "cpu-cpu") for name in shipped}
    assert len(shipped) == 9 and pairs == {(recipe, pair) for recipe in ("dqn", "ppo", "tiny")
                                           for pair in ("cpu-cpu", "cuda-cpu", "cuda-cuda")}, shipped


def test_jobs_imports_nothing_else_of_ours():
    for path in (ROOT / "jobs").rglob("*.py"):
        text = path.read_text()
        for other in ("broker", "backends", "verify", "wallet", "storage"):
            assert f"trainmaster.{other}" not in text, f"{path} imports trainmaster.{other}"


def test_backends_never_import_broker():
    for path in (ROOT / "backends").rglob("*.py"):
        assert "trainmaster.broker" not in path.read_text(), f"{path} imports the broker"

"""No two modules share a name unless the name is a convention of the folders they are in.

A module's name says what it holds; two files of one name with different meanings (`progress.py` for a job's
progress and for the CLI's transfer bar) make every import, grep and traceback ambiguous. The conventions: each
backend's folder holds its `backend`, `config`, `check` and `sdk`, and `broker/cli/` holds one module per command
named after what it manages (`cli/outputs.py`, the `outputs` command, beside `jobs/outputs.py`). PAIRS_LEFT lists
the names still shared when this rule was written; it may only shrink.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from repo_paths import ROOT

LAYERS = ("broker", "backends", "jobs", "verify", "wallet", "storage")
PER_BACKEND = {"backend", "config", "check", "sdk"}
COMMANDS = {p.stem for p in (ROOT / "broker" / "cli").glob("*.py")} & {"calibrate", "executors", "outputs"}
PAIRS_LEFT = {
    "app": {"backends/bittensor/miner/app.py", "broker/daemon/app.py"},
    "files": {"backends/bittensor/miner/files.py", "jobs/files.py"},
    "metrics": {"broker/daemon/web/metrics.py", "jobs/metrics.py"},
    "records": {"broker/daemon/triggers/records.py", "broker/promotion/records.py", "verify/records.py"},
    "signing": {"jobs/signing.py", "verify/signing.py"},
    "store": {"backends/bittensor/miner/store.py", "broker/store.py"},
    "transfer": {"backends/catalog/transfer.py", "backends/transfer.py"},
    "config": {"backends/bittensor/miner/config.py", "backends/config.py", "broker/promotion/config.py"},
}


def modules_by_name(root: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for layer in LAYERS:
        for path in (root / layer).rglob("*.py"):
            if "__pycache__" not in path.parts and not path.name.startswith("__"):
                found[path.stem].add(path.relative_to(root).as_posix())
    return found


def by_convention(name: str, path: str) -> bool:
    parts = path.split("/")
    if name in PER_BACKEND and len(parts) == 3 and parts[0] == "backends":
        return True  # backends/<backend>/<name>.py
    return name in COMMANDS and path == f"broker/cli/{name}.py"


def shared_names(root: Path) -> dict[str, set[str]]:
    """Each name two or more modules share, with the modules not explained by a folder's convention."""
    out = {}
    for name, paths in modules_by_name(root).items():
        unexplained = {p for p in paths if not by_convention(name, p)}
        if len(unexplained) > 1:
            out[name] = unexplained
    return out


def test_no_new_module_shares_a_name_with_another():
    found = shared_names(ROOT)
    new = {name: paths for name, paths in found.items() if not paths <= PAIRS_LEFT.get(name, set())}
    assert not new, f"modules that share a name (rename one so the name says what it holds): {new}"


def test_the_pairs_left_are_still_there_so_the_list_only_shrinks():
    found = shared_names(ROOT)
    gone = {name: paths - found.get(name, set()) for name, paths in PAIRS_LEFT.items()}
    assert not any(gone.values()), f"no longer shared: remove them from PAIRS_LEFT: {gone}"


def test_the_check_tells_a_pair_from_a_convention(tmp_path):
    for path in ("broker/progress.py", "broker/cli/progress.py", "backends/aws/config.py", "backends/gcp/config.py",
                 "broker/cli/outputs.py", "jobs/outputs.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert shared_names(tmp_path) == {"progress": {"broker/progress.py", "broker/cli/progress.py"}}

"""The broker's structure, measured on the source with `ast` (issue #34's figures):

- the largest file in broker/ (lines) and the largest class (lines, from its `class` line to its last), with their
  names; targets: `Broker` a façade of a few hundred lines at most, no file near the 1,234 lines service.py had;
- modules per folder of broker/ (its top level had 33 loose modules, 13 under 60 lines);
- SQL statements that name a table outside the module that owns it (tests/sql_owners.py; target 0).

The smoke run measures the same tree (it only reads source files).

Run: python tests/benchmarks/bench_structure.py
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
from _common import print_figures  # noqa: E402
from sql_owners import foreign_statements  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BROKER = ROOT / "broker"
SMALL = 60


def _modules() -> list[Path]:
    return sorted(p for p in BROKER.rglob("*.py") if "__pycache__" not in p.parts)


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def classes() -> dict[str, int]:
    """`path:Class` -> its lines, for every class in broker/."""
    found = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found[f"{path.relative_to(ROOT)}:{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def per_folder() -> Counter:
    """Modules (not counting `__init__`, `__main__`) in each folder of broker/, by the folder's path."""
    return Counter(str(p.parent.relative_to(ROOT)) for p in _modules() if not p.name.startswith("__"))


def run(smoke: bool = False) -> dict[str, float]:
    files = [(p, _lines(p)) for p in _modules()]
    biggest, biggest_lines = max(files, key=lambda item: item[1])
    sizes = classes()
    cls, cls_lines = max(sizes.items(), key=lambda item: item[1])
    folders = per_folder()
    top = [(p, n) for p, n in files if p.parent == BROKER and not p.name.startswith("__")]
    foreign = foreign_statements(ROOT)
    if not smoke:
        print(f"\nlargest file: {biggest.relative_to(ROOT)} ({biggest_lines} lines); largest class: {cls} "
              f"({cls_lines} lines)")
        print("modules per folder of broker/:")
        for folder, count in sorted(folders.items()):
            print(f"  {folder:<32} {count}")
        print(f"SQL statements naming another module's table ({len({f.where for f in foreign})}):")
        for f in sorted(foreign, key=lambda f: (f.where.split(":")[0], int(f.where.split(":")[1]), f.table)):
            print(f"  {f.where:<44} {f.table:<16} owned by {', '.join(f.owners)}")
    return {
        "broker_largest_file_lines": biggest_lines,
        "broker_largest_class_lines": cls_lines,
        "broker_service_py_lines": _lines(BROKER / "service.py"),
        "broker_facade_class_lines": sizes["broker/service.py:Broker"],
        "broker_top_level_modules": len(top),
        "broker_top_level_modules_under_60_lines": sum(1 for _, n in top if n < SMALL),
        "broker_folders": len(folders),
        "broker_most_modules_in_a_folder": max(folders.values()),
        "sql_statements_outside_their_owner": len({f.where for f in foreign}),
    }


if __name__ == "__main__":
    print_figures("the broker's structure (ast over the source)", run(),
                  {"broker_facade_class_lines": "a few hundred at most (Broker was 989)",
                   "broker_service_py_lines": "was 1,234", "sql_statements_outside_their_owner": "0"})

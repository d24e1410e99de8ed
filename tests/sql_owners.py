"""Who owns each table of the state database, and which SQL statements name a table outside its owner.

A table's owner is the module whose SQL creates it (`CREATE TABLE name`: its migrations). A statement is a string
literal (or an f-string's fixed parts) that reads as SQL (starts with `SELECT`, `INSERT`, `UPDATE`, `DELETE` or
`WITH`, or holds `FROM`/`JOIN` and a name: a fragment of one; keywords in capitals, as this code writes SQL), and a
table is named where it follows `FROM`, `JOIN`, `INTO` or `UPDATE`. A module may declare itself part of its owner
(`SQL_PART_OF = "wallet/ledger.py"`: the ledger's read side, kept apart so a read imports less) and is then judged as
that owner. Counted by tests/benchmarks/bench_structure.py; the figure the architecture asks for is 0.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

LAYERS = ("broker", "backends", "jobs", "verify", "wallet", "storage")
CREATES = re.compile(r"CREATE TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_]+)")
NAMES = re.compile(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+([a-z_]+)")
SQL_START = re.compile(r"^\s*(?:SELECT|INSERT|UPDATE|DELETE|WITH|REPLACE)\b|\b(?:FROM|JOIN)\s+[a-z_]+\b")


@dataclass(frozen=True)
class Foreign:
    where: str
    """file:line"""
    table: str
    owners: tuple[str, ...]


def _strings(tree: ast.AST):
    """(line, text) of every string literal and every f-string (its fixed text, each placeholder an `x`), once."""
    inside = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else " x " for v in node.values)


def _files(root: Path):
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path, path.relative_to(root).as_posix()


def table_owners(root: Path) -> dict[str, set[str]]:
    """table -> the modules (paths) whose SQL creates it."""
    owners: dict[str, set[str]] = defaultdict(set)
    for path, rel in _files(root):
        for _, text in _strings(ast.parse(path.read_text(encoding="utf-8"))):
            for table in CREATES.findall(text):
                if table.lower() != "x":
                    owners[table.lower()].add(rel)
    return dict(owners)


def _part_of(tree: ast.Module) -> str | None:
    """The owner a module declares itself part of (`SQL_PART_OF = "path"` at module level), if any."""
    for node in tree.body:
        if (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["SQL_PART_OF"]
                and isinstance(node.value, ast.Constant)):
            return node.value.value
    return None


def foreign_statements(root: Path) -> list[Foreign]:
    """Every SQL statement that names a table it does not own, with where it is."""
    owners = table_owners(root)
    found = []
    for path, rel in _files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        as_owner = _part_of(tree) or rel
        for line, text in _strings(tree):
            if not SQL_START.search(text) or CREATES.search(text):
                continue
            for table in dict.fromkeys(t.lower() for t in NAMES.findall(text)):
                if table in owners and as_owner not in owners[table]:
                    found.append(Foreign(f"{rel}:{line}", table, tuple(sorted(owners[table]))))
    return found

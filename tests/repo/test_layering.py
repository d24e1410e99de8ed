"""The dependency rule and "no import cycles between files", checked on the source with `ast`.

The rule (docs/architecture.md §1): `jobs` and `storage` import nothing else of ours; `verify` and
`wallet` may import only `storage` and `jobs`; `backends` may import `wallet`, `storage` and `jobs`
(keys, rates and payments; never `broker`, never `verify`); `configs` (example job scripts) may import
only `jobs`, the in-job API; `broker` may import everything.

Which imports count:

- **Layer rule: every import** — at module level, inside a function, and under
  `if TYPE_CHECKING:`. A lazy or type-only import still couples the two layers.
- **Cycles, module level**: the imports that run when a module is imported. They exclude those
  under `if TYPE_CHECKING:`, which never run: naming another module's type in an annotation is no
  dependency at run time.
- **Cycles, with function-local imports added**: a lazy import that closes a cycle is the same
  coupling with the import moved to dodge the ImportError, and importing inside a function does
  run the other file. So these cycles fail too (in their own test, to say which kind it is).

An import edge goes to the module it names: `from pkg import name` to `pkg.name` when that is a
module, else to `pkg`. The parent packages Python initialises on the way (`pkg/__init__.py`) are
not edges: an `__init__` that imports its submodules would otherwise put every pair of siblings on
a cycle that Python handles fine.

Imports by string count too: `importlib.import_module("trainmaster.x.y")` is an edge to that module,
and one whose name is built (`f"{__name__}.{name}"`, `"trainmaster.jobs.recipes." + name`) is an edge
to every module of ours its fixed start could name (`__name__` read as the importing module's name).
A name that starts with nothing fixed (the user's own module) is no edge.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from repo_paths import ROOT

NAMESPACE = "trainmaster"
LAYERS = ("broker", "backends", "jobs", "verify", "wallet", "storage", "configs")
ALLOWED: dict[str, tuple[frozenset[str], str]] = {
    "jobs": (frozenset({"jobs"}), "jobs imports nothing else of ours"),
    "storage": (frozenset({"storage"}), "storage imports nothing else of ours"),
    "backends": (frozenset({"backends", "wallet", "storage", "jobs"}),
                 "backends may import wallet, storage and jobs (never broker or verify)"),
    "verify": (frozenset({"verify", "storage", "jobs"}), "verify may import only storage and jobs (and itself)"),
    "wallet": (frozenset({"wallet", "storage", "jobs"}), "wallet may import only storage and jobs (and itself)"),
    "configs": (frozenset({"configs", "jobs"}), "configs (example job scripts) may import only jobs"),
    "broker": (frozenset(LAYERS), "broker may import every subpackage"),
}

MODULE, FUNCTION, TYPE_ONLY = "module-level", "function-local", "TYPE_CHECKING"


@dataclass(frozen=True)
class Edge:
    source: str  # importing module
    target: str  # imported module (dotted; may be outside the tree)
    path: str  # importing file, relative to the root
    line: int
    kind: str  # MODULE, FUNCTION or TYPE_ONLY

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([NAMESPACE, *parts])


def source_files(root: Path) -> Iterator[Path]:
    for layer in LAYERS:
        folder = root / layer
        if folder.is_dir():
            yield from sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _is_type_checking(test: ast.expr) -> bool:
    """`TYPE_CHECKING` or `<anything>.TYPE_CHECKING` (typing.TYPE_CHECKING)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterator[tuple[ast.Import | ast.ImportFrom | ast.Call, str]]:
    """Every import statement, and every `import_module(...)` call, with its kind: inside a function,
    under TYPE_CHECKING, or module level."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom | ast.Call, str]]:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_import_module(node):
            yield node, kind
            if isinstance(node, ast.Call):
                for child in ast.iter_child_nodes(node):
                    yield from walk(child, kind)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and kind == MODULE:
            kind = FUNCTION
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from walk(child, TYPE_ONLY)
            for child in node.orelse:
                yield from walk(child, kind)
            yield from walk(node.test, kind)
            return
        for child in ast.iter_child_nodes(node):
            yield from walk(child, kind)

    yield from walk(tree, MODULE)


def _is_import_module(node: ast.AST) -> bool:
    """A call of `importlib.import_module` (or `import_module` imported from it) with an argument."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id == "import_module")


def _fixed_start(arg: ast.expr, module: str) -> tuple[str, bool]:
    """The fixed start of the module name `arg` evaluates to, and whether that is the whole name."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value, True
    if isinstance(arg, ast.Name) and arg.id == "__name__":
        return module, True
    if isinstance(arg, ast.FormattedValue) and arg.format_spec is None and arg.conversion == -1:
        return _fixed_start(arg.value, module)
    if isinstance(arg, ast.JoinedStr):
        parts = arg.values
    elif isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        parts = [arg.left, arg.right]
    else:
        return "", False
    start = ""
    for part in parts:
        text, whole = _fixed_start(part, module)
        start += text
        if not whole:
            return start, False
    return start, True


def _dynamic_targets(node: ast.Call, module: str, known: set[str]) -> list[str]:
    """The modules an `import_module` call may import: its name, or every known module its fixed start could name."""
    start, whole = _fixed_start(node.args[0], module)
    if whole:
        return [start]
    if not start.startswith(NAMESPACE + "."):
        return []
    return sorted(m for m in known if m.startswith(start))


def _relative_base(module: str, is_package: bool, level: int, what: str) -> str:
    """The package a relative import of `level` dots starts from."""
    package = module if is_package else module.rpartition(".")[0]
    parts = package.split(".")
    if level - 1 >= len(parts):
        raise ValueError(f"{what}: relative import beyond the top-level package")
    return ".".join(parts[: len(parts) - (level - 1)])


def import_edges(root: Path) -> tuple[list[Edge], set[str]]:
    """Every import of a `trainmaster` module in the tree, and the set of modules the tree holds."""
    files = list(source_files(root))
    known = {module_name(root, p) for p in files}
    edges: list[Edge] = []
    for path in files:
        source = module_name(root, path)
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node, kind in _imports(tree):
            if isinstance(node, ast.Call):
                targets = _dynamic_targets(node, source, known)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    start = _relative_base(source, path.name == "__init__.py", node.level, f"{rel}:{node.lineno}")
                    base = f"{start}.{base}" if base else start
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
                ]
            for target in dict.fromkeys(targets):
                if target == NAMESPACE or target.startswith(NAMESPACE + "."):
                    edges.append(Edge(source, target, rel, node.lineno, kind))
    return edges, known


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == NAMESPACE else None


def rule_violations(edges: list[Edge]) -> list[str]:
    """One line per import that breaks the dependency rule (file:line, what, the rule), sorted."""
    found = []
    for e in edges:
        source_layer, target_layer = layer_of(e.source), layer_of(e.target)
        allowed, rule = ALLOWED[source_layer]
        if target_layer not in allowed:
            what = f"{e.target} is not one of our subpackages" if target_layer not in ALLOWED else rule
            found.append(f"{e.where}: imports {e.target} ({e.kind}): {what}")
    return sorted(found)


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_cycles(edges: list[Edge], known: set[str], kinds: frozenset[str]) -> list[list[Edge]]:
    """One shortest cycle per group of mutually importing files, over the edges of `kinds`, as its edges."""
    by_pair: dict[tuple[str, str], Edge] = {}
    for e in edges:
        if e.kind in kinds and e.target in known and e.target != e.source:
            by_pair.setdefault((e.source, e.target), e)
    graph: dict[str, set[str]] = {}
    for source, target in by_pair:
        graph.setdefault(source, set()).add(target)
    cycles = []
    for component in _components(graph):
        members, start = set(component), component[0]
        came_from: dict[str, str] = {}
        queue = deque([start])
        while queue:
            v = queue.popleft()
            if v != start and start in graph[v]:
                path = [start]
                while v != start:
                    path.append(v)
                    v = came_from[v]
                path = [start, *reversed(path[1:]), start]
                cycles.append([by_pair[a, b] for a, b in zip(path, path[1:])])
                break
            for w in sorted(graph[v] & members):
                if w not in came_from and w != start:
                    came_from[w] = v
                    queue.append(w)
    return cycles


def describe(cycle: list[Edge]) -> str:
    return " → ".join(f"{e.source} ({e.where}, {e.kind})" for e in cycle) + f" → {cycle[0].source}"


RUNTIME = frozenset({MODULE})
RUNTIME_AND_LAZY = frozenset({MODULE, FUNCTION})


# the real tree


@pytest.fixture(scope="module")
def tree() -> tuple[list[Edge], set[str]]:
    return import_edges(ROOT)


def test_the_checker_sees_the_whole_tree(tree):
    edges, known = tree
    assert {layer_of(m) for m in known} == set(LAYERS)
    assert {"trainmaster.verify.records", "trainmaster.storage.statedb", "trainmaster.broker.service"} <= known
    kinds = {e.kind for e in edges}
    assert {MODULE, FUNCTION, TYPE_ONLY} <= kinds, kinds
    assert any(e.source == "trainmaster.broker.service" and e.target == "trainmaster.broker.paths" for e in edges)


def test_every_import_follows_the_dependency_rule(tree):
    edges, _ = tree
    violations = rule_violations(edges)
    assert not violations, "imports that break the dependency rule:\n" + "\n".join(violations)


def test_no_import_cycles_between_files(tree):
    edges, known = tree
    cycles = import_cycles(edges, known, RUNTIME)
    assert not cycles, "import cycles:\n" + "\n".join(map(describe, cycles))


def test_no_import_cycles_even_through_function_local_imports(tree):
    edges, known = tree
    cycles = import_cycles(edges, known, RUNTIME_AND_LAZY)
    assert not cycles, "import cycles closed by a function-local import:\n" + "\n".join(map(describe, cycles))


# one home for each concept: who may borrow what (every kind of import counts)

NOT_BORROWED = [  # (who, what it must not import, the package that may, why)
    ("trainmaster.broker", ("trainmaster.backends.aws", "trainmaster.backends.gcp", "trainmaster.backends.azure"), None,
     "the broker names no cloud: a store is the registry's (backends/registry.py store_for), a backend by name"),
    ("trainmaster.broker.daemon", ("trainmaster.broker.cli",), None,
     "the daemon borrows nothing of the CLI: a job's JSON view is broker/job_view.py"),
    ("trainmaster.backends", ("trainmaster.backends.local.backend",), "trainmaster.backends.local",
     "the local backend is no library: segments are backends/segments.py's, time limits backends/time_limit.py's"),
]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def borrowings(edges: list[Edge]) -> list[str]:
    """One line per import of a module another part must not borrow (file:line, what, why)."""
    found = []
    for e in edges:
        for source, targets, home, why in NOT_BORROWED:
            if not _within(e.source, source) or (home and _within(e.source, home)):
                continue
            if any(_within(e.target, t) for t in targets):
                found.append(f"{e.where}: imports {e.target} ({e.kind}): {why}")
    return sorted(found)


def test_each_concept_has_one_home_that_others_do_not_bypass(tree):
    edges, _ = tree
    found = borrowings(edges)
    assert not found, "borrowed past its home:\n" + "\n".join(found)


def test_the_borrowing_check_sees_a_cloud_named_by_the_broker():
    edges = [Edge("trainmaster.broker.filekeeping.shared_storage", "trainmaster.backends.aws.s3",
                  "broker/filekeeping/shared_storage.py", 7, FUNCTION),
             Edge("trainmaster.broker.daemon.api", "trainmaster.broker.cli.render", "broker/daemon/api.py", 3, FUNCTION),
             Edge("trainmaster.backends.ray.backend", "trainmaster.backends.local.backend", "backends/ray/backend.py", 4,
                  MODULE),
             Edge("trainmaster.backends.registry", "trainmaster.backends.aws.s3", "backends/registry.py", 9, FUNCTION)]
    assert [line.split(":")[0] for line in borrowings(edges)] == [
        "backends/ray/backend.py", "broker/daemon/api.py", "broker/filekeeping/shared_storage.py"]


BROKER_FOLDERS = {  # the broker's map (docs/architecture.md, "Layout"): each folder and what it holds
    "broker": "the façade (service.py), the state store, the backends as the broker uses them, the job's JSON view",
    "broker/stages": "one module per stage of a job's life, as functions over a shared context",
    "broker/planning": "cost policies, the planner, estimates, gating, the stored plan",
    "broker/money": "budget waits, the cost cap, agreed prices, settlement and conclusions, payment sending",
    "broker/filekeeping": "shared storage, shared bundles and outputs, reclaiming disk, retention",
    "broker/cli": "all typer/Rich code",
    "broker/daemon": "the scheduler daemon", "broker/daemon/triggers": "the daemon's triggers",
    "broker/daemon/web": "/metrics and the dashboard", "broker/promotion": "accepted models into MLflow",
}


def test_the_broker_has_the_folders_its_map_names_and_no_others():
    root = ROOT
    found = {p.parent.relative_to(root).as_posix() for p in (root / "broker").rglob("__init__.py")}
    assert found == set(BROKER_FOLDERS), f"broker/ folders not on the map (or gone from it): {found ^ set(BROKER_FOLDERS)}"
    page = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    for folder in BROKER_FOLDERS:
        if folder.count("/") == 1 and folder != "broker/daemon":
            assert f"{folder.split('/')[1]}/" in page, f"docs/architecture.md does not name {folder}/"


# the checker itself, on a synthetic tree

SYNTHETIC = {
    "jobs/__init__.py": "",
    "jobs/spec.py": "import os\n\ndef load():\n    from trainmaster.broker import store\n",
    "backends/__init__.py": "",
    "backends/base.py": (
        "from typing import TYPE_CHECKING\nimport typing\n"
        "if TYPE_CHECKING:\n    from ..broker.store import Store\n"
        "if typing.TYPE_CHECKING:\n    pass\nelse:\n    from ..jobs import spec\n"
    ),
    "verify/__init__.py": "from . import h\n",
    "verify/a.py": "from . import b\n",
    "verify/b.py": "from .c import thing\n",
    "verify/c.py": "import json\nfrom trainmaster.verify import a\n",
    "verify/d.py": "from . import e\n",
    "verify/e.py": "def later():\n    from .d import x\n",
    "verify/f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .g import G\n",
    "verify/g.py": "from .f import F\n",
    "verify/h.py": "from trainmaster.verify import a\n",
    "broker/__init__.py": "",
    "broker/store.py": "",
    "broker/service.py": "import trainmaster.verify.a\nfrom trainmaster.wallet import ledger\nfrom trainmaster.nowhere import x\n",
    "wallet/__init__.py": "",
    "wallet/ledger.py": "from trainmaster.jobs.spec import load\nfrom trainmaster.jobs import not_a_module\n",
    "jobs/plugins/__init__.py": (
        "import importlib\nfrom importlib import import_module\n"
        "def by_name(name, user):\n"
        "    importlib.import_module(f\"{__name__}.{name}\")\n"
        "    import_module(\"trainmaster.wallet.ledger\")\n"
        "    importlib.import_module(\"trainmaster.jobs.spec\" + name)\n"
        "    importlib.import_module(user)\n"
        "importlib.import_module(\"json\")\n"
    ),
    "jobs/plugins/a.py": "",
}


@pytest.fixture
def synthetic(tmp_path) -> tuple[list[Edge], set[str]]:
    for name, text in SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return import_edges(tmp_path)


def test_checker_resolves_absolute_relative_and_nested_imports(synthetic):
    edges, known = synthetic
    got = {(e.source.removeprefix("trainmaster."), e.target.removeprefix("trainmaster."), e.line, e.kind)
           for e in edges}
    assert got == {
        ("jobs.spec", "broker.store", 4, FUNCTION),
        ("backends.base", "broker.store", 4, TYPE_ONLY),
        ("backends.base", "jobs.spec", 8, MODULE),  # the else branch of TYPE_CHECKING runs
        ("verify", "verify.h", 1, MODULE),  # `from . import h` in an __init__: the package itself
        ("verify.a", "verify.b", 1, MODULE),
        ("verify.b", "verify.c", 1, MODULE),
        ("verify.c", "verify.a", 2, MODULE),
        ("verify.d", "verify.e", 1, MODULE),
        ("verify.e", "verify.d", 2, FUNCTION),
        ("verify.f", "verify.g", 3, TYPE_ONLY),
        ("verify.g", "verify.f", 1, MODULE),
        ("verify.h", "verify.a", 1, MODULE),
        ("broker.service", "verify.a", 1, MODULE),
        ("broker.service", "wallet.ledger", 2, MODULE),
        ("broker.service", "nowhere", 3, MODULE),
        ("wallet.ledger", "jobs.spec", 1, MODULE),
        ("wallet.ledger", "jobs", 2, MODULE),  # a name that is no module: the package
        ("jobs.plugins", "jobs.plugins.a", 4, FUNCTION),  # import_module(f"{__name__}.{name}"): each module it may name
        ("jobs.plugins", "wallet.ledger", 5, FUNCTION),  # import_module("trainmaster.wallet.ledger")
        ("jobs.plugins", "jobs.spec", 6, FUNCTION),  # "trainmaster.jobs.spec" + name: the modules it may name
    }


def test_checker_reports_rule_violations_with_file_line_and_rule(synthetic):
    edges, _ = synthetic
    assert rule_violations(edges) == [
        "backends/base.py:4: imports trainmaster.broker.store (TYPE_CHECKING): backends may import wallet, storage and jobs (never broker or verify)",
        "broker/service.py:3: imports trainmaster.nowhere (module-level): trainmaster.nowhere is not one of our subpackages",
        "jobs/plugins/__init__.py:5: imports trainmaster.wallet.ledger (function-local): jobs imports nothing else of ours",
        "jobs/spec.py:4: imports trainmaster.broker.store (function-local): jobs imports nothing else of ours",
    ]


def test_checker_finds_cycles_of_each_kind(synthetic):
    edges, known = synthetic

    def members(kinds):
        return sorted(sorted(e.source.removeprefix("trainmaster.verify.") for e in c)
                      for c in import_cycles(edges, known, kinds))

    assert members(RUNTIME) == [["a", "b", "c"]]
    assert members(RUNTIME_AND_LAZY) == [["a", "b", "c"], ["d", "e"]]  # f ↔ g is type-only: no cycle
    (cycle,) = import_cycles(edges, known, RUNTIME)
    assert describe(cycle) == (
        "trainmaster.verify.a (verify/a.py:1, module-level) → trainmaster.verify.b (verify/b.py:1, module-level)"
        " → trainmaster.verify.c (verify/c.py:2, module-level) → trainmaster.verify.a"
    )


def test_relative_import_beyond_the_top_is_an_error(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "x.py").write_text("from ... import y\n")
    with pytest.raises(ValueError, match=r"jobs/x.py:1: relative import beyond"):
        import_edges(tmp_path)

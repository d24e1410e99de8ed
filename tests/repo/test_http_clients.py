"""One HTTP client library (docs/architecture.md, "One HTTP client library"): every HTTP request the package sends
itself goes over aiohttp, and every aiohttp session it opens has a timeout.

Checked on the source with `ast`, like tests/repo/test_layering.py: an import of another HTTP client library anywhere in
the package fails, at module level or inside a function, under `if TYPE_CHECKING:` or by string
(`importlib.import_module("requests")`). The cloud SDKs' own transports (boto3's urllib3, google-auth's requests,
Azure's core pipeline, Ray's and MLflow's clients) are theirs, not ours; a module that must name one of their types
to tell their errors apart is listed in SDK_TYPES with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path
from repo_paths import ROOT

PACKAGE = ("broker", "backends", "jobs", "verify", "wallet", "storage", "configs")
OTHER_CLIENTS = ("urllib.request", "urllib.error", "urllib3", "http.client", "requests", "httpx", "httpcore",
                 "pycurl", "tornado.httpclient", "treq", "niquests")
SDK_TYPES = {
    ("backends/gcp/sdk.py", "requests"): "google-cloud-aiplatform's transport raises requests' connection errors "
                                         "and timeouts; they are told apart as transient, no request is sent with it",
}


def _named(node: ast.AST) -> list[str]:
    """The module names an import statement or an `import_module("...")` call names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and ((isinstance(node.func, ast.Attribute) and node.func.attr in ("import_module", "__import__"))
                 or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))):
        return [node.args[0].value]
    return []


def _other_client(name: str) -> str | None:
    return next((lib for lib in OTHER_CLIENTS if name == lib or name.startswith(lib + ".")), None)


def foreign_clients(root: Path) -> list[str]:
    """`path:line: library` for each import of another HTTP client library in the package."""
    found = []
    for layer in PACKAGE:
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                for name in _named(node):
                    lib = _other_client(name)
                    if lib is not None and (rel, lib) not in SDK_TYPES:
                        found.append(f"{rel}:{node.lineno}: {lib}")
    return sorted(set(found))


def sessions_without_timeout(root: Path) -> list[str]:
    """`path:line` for each `aiohttp.ClientSession(...)` made without a `timeout=`."""
    found = []
    for layer in PACKAGE:
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), rel)):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name == "ClientSession" and not any(k.arg in ("timeout", None) for k in node.keywords):
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_the_package_sends_http_over_aiohttp_only():
    found = foreign_clients(ROOT)
    assert not found, ("another HTTP client library than aiohttp (docs/architecture.md, \"One HTTP client "
                       "library\"):\n" + "\n".join(f"  {line}" for line in found))


def test_every_aiohttp_session_has_a_timeout():
    found = sessions_without_timeout(ROOT)
    assert not found, "an aiohttp session without a timeout (every outward call has one):\n" + "\n".join(found)


def test_the_sdk_exceptions_are_still_needed():
    """An SDK_TYPES entry whose module no longer names that library goes (the list never hides a new client)."""
    for (rel, lib), why in SDK_TYPES.items():
        names = [n for node in ast.walk(ast.parse((ROOT / rel).read_text())) for n in _named(node)]
        assert any(_other_client(n) == lib for n in names), f"{rel} no longer imports {lib}: drop it ({why})"


def test_the_check_sees_each_way_of_importing_a_client(tmp_path):
    (tmp_path / "wallet").mkdir()
    (tmp_path / "backends" / "x").mkdir(parents=True)
    (tmp_path / "wallet" / "a.py").write_text("import urllib.request\n")
    (tmp_path / "wallet" / "b.py").write_text("def f():\n    from http import client\n    import requests.adapters\n")
    (tmp_path / "backends" / "x" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import httpx\n"
        "import importlib\nm = importlib.import_module('urllib3')\nfrom urllib.parse import quote\nimport aiohttp\n"
        "s = aiohttp.ClientSession()\nt = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))\n")
    assert foreign_clients(tmp_path) == ["backends/x/c.py:3: httpx", "backends/x/c.py:5: urllib3",
                                         "wallet/a.py:1: urllib.request", "wallet/b.py:2: http.client",
                                         "wallet/b.py:3: requests"]
    assert sessions_without_timeout(tmp_path) == ["backends/x/c.py:8"]

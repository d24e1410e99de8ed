"""Load ``torch._dynamo`` (about 840 modules, 1.5 CPU-s) only when something compiles.

torch's optimizers import ``torch._dynamo`` on their first call (``Optimizer.__init__`` through
``add_param_group``, every ``step`` through ``_use_grad``) for two things only: to mark their own methods
as not to be compiled (``torch._dynamo.disable``) and to place graph breaks (``torch._dynamo.graph_break``).
In a process that compiles nothing both are no-ops, yet every training run, self-check and audit
re-execution paid the import: as much again as ``import torch`` itself.

:func:`defer` puts a stand-in at ``sys.modules["torch._dynamo"]`` that answers exactly those two calls
while the real package is not loaded, and loads it on any other use: another attribute (``torch.compile``
reads several), a submodule's import, ``TRAINMASTER_EAGER_DYNAMO=1`` in the environment (no stand-in at
all). From then on the stand-in forwards everything to the real package, and what it handed out behaves as
the real functions do: each method marked while deferred is marked for real as the package loads.
Nothing is deferred where ``torch._dynamo`` was already loaded.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

NAME = "torch._dynamo"
EAGER_ENV = "TRAINMASTER_EAGER_DYNAMO"

_CACHE = "__dynamo_disable"
"""Where ``torch._disable_dynamo`` keeps the wrapper it got for a function (torch/_compile.py)."""

_lock = threading.RLock()
_marked: list[tuple[Callable[..., Any], bool, Callable[..., Any]]] = []
"""What :func:`_disable` handed out while deferred: re-marked for real when the package loads, so that
compiled code meets exactly what it would have without the stand-in."""
_real: types.ModuleType | None = None
_standin: _Standin | None = None


def defer() -> bool:
    """Install the stand-in (idempotent); False where dynamo is loaded already, or eager loading is asked for."""
    global _standin
    if os.environ.get(EAGER_ENV) == "1":
        return False
    with _lock:
        if _standin is not None:
            return _real is None
        if NAME in sys.modules:
            return False
        import torch

        spec = importlib.machinery.PathFinder.find_spec(NAME, list(torch.__path__))
        if spec is None or spec.submodule_search_locations is None:
            return False
        standin = _Standin(NAME, spec)
        _standin = standin
        sys.modules[NAME] = standin
        torch._dynamo = standin  # type: ignore[attr-defined]
        sys.meta_path.insert(0, _SubmoduleFinder())
        return True


def loaded() -> bool:
    """Whether the real ``torch._dynamo`` is in this process (it is wherever no stand-in was installed)."""
    return _real is not None or (_standin is None and NAME in sys.modules)


def _load() -> types.ModuleType:
    """The real package, imported now if it is not yet (the stand-in steps aside for it).

    The import runs outside this module's lock, under the import system's own: a thread importing a
    ``torch._dynamo`` submodule meanwhile waits for the same module locks, never for this one."""
    global _real
    real = _real
    if real is not None:
        return real
    import torch

    with _lock:
        sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _SubmoduleFinder)]
        if _standin is not None and sys.modules.get(NAME) is _standin:
            del sys.modules[NAME]
        if _standin is not None and torch.__dict__.get("_dynamo") is _standin:
            del torch.__dict__["_dynamo"]
    real = importlib.import_module(NAME)
    _real = real
    with _lock:
        marked, _marked[:] = list(_marked), []
    for fn, recursive, deferred in marked:
        if getattr(fn, _CACHE, None) is deferred:
            setattr(fn, _CACHE, real.disable(fn, recursive, wrapping=False))
    return real


def _graph_break(msg: str = "") -> None:
    """``torch._dynamo.graph_break`` outside compiled code: nothing (it only means something to the tracer)."""


def _disable(fn: Callable[..., Any] | None = None, recursive: bool = True, **kwargs: Any) -> Callable[..., Any]:
    """``torch._dynamo.disable`` as ``torch._disable_dynamo`` calls it (``fn``, ``recursive``, ``wrapping=False``).

    While dynamo is not loaded no frame is being compiled, so calling ``fn`` directly is what the real
    wrapper does; once it is loaded, the real wrapper is made (once) and called instead. Any other use
    loads the real package and is its answer.
    """
    if _real is not None or fn is None or kwargs != {"wrapping": False}:
        return _load().disable(fn, recursive, **kwargs)
    made: list[Callable[..., Any]] = []

    def deferred(*args: Any, **kw: Any) -> Any:
        real = _real
        if real is None:
            return fn(*args, **kw)
        if not made:
            made.append(real.disable(fn, recursive, wrapping=False))
        return made[0](*args, **kw)

    with _lock:
        _marked.append((fn, recursive, deferred))
    return deferred


_ANSWERS: dict[str, Callable[..., Any]] = {"graph_break": _graph_break, "disable": _disable}


class _Standin(types.ModuleType):
    """``sys.modules["torch._dynamo"]`` until something needs the real package; a forwarder after."""

    def __init__(self, name: str, spec: importlib.machinery.ModuleSpec) -> None:
        super().__init__(name, "Deferred torch._dynamo: loaded on first use (trainmaster.jobs.lazy_dynamo).")
        self.__spec__ = spec
        self.__loader__ = spec.loader
        self.__package__ = name
        self.__path__ = list(spec.submodule_search_locations or [])
        if spec.origin:
            self.__file__ = spec.origin

    def __getattr__(self, name: str) -> Any:
        if _real is None and name in _ANSWERS:
            return _ANSWERS[name]
        if _real is None and name.startswith("__") and name.endswith("__") and name != "__all__":
            # a probe of what a module has (inspect, pickle's search of sys.modules, doctest): the real
            # package defines none of these but __all__, so the answer is the same without loading it
            raise AttributeError(f"module {NAME!r} has no attribute {name!r}")
        return getattr(_load(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if _real is not None and not name.startswith("__"):
            setattr(_real, name, value)

    def __dir__(self) -> list[str]:
        return dir(_load())


class _AlreadyLoaded(importlib.abc.Loader):
    """Hands the import system a submodule the real package's own import loaded, instead of running it twice."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module
        self.spec = getattr(module, "__spec__", None)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.spec


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """A ``torch._dynamo.<sub>`` import loads the real package first (its ``__init__`` before any part of it)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(NAME + ".") or _real is not None:
            return None
        _load()
        module = sys.modules.get(fullname)
        if module is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AlreadyLoaded(module))

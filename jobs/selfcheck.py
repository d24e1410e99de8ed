"""The end-of-run self-check: does ``state()`` capture everything the next steps read?

A replay audit re-executes a segment from the committed S_i alone, in another process. A trainer
that keeps something its ``state()`` does not return — a shuffled DataLoader's iterator, a cursor
in a Python attribute, a module-level generator — trains "fine" and then fails every audit of its
honest run. So, before the run commits, the runtime replays its **last segment** (S_{n-1} → S_n,
the one furthest from the start, where such hidden state has drifted most; the first segment
cannot show it, as a freshly built trainer starts where the run did) in a **fresh process**,
following the segment's recorded decisions, and compares the full state it reaches with the
committed S_n bit for bit. On any difference the job fails with::

    state() does not capture everything the next steps read: <the entries that differ>

The process is started with the run (:meth:`SelfCheck.start`) at nice +10, so importing torch, the
recipe and torch's compiler stack (which the first optimizer built would otherwise import, seconds)
overlaps training on CPU time it leaves idle; at the end it is handed the segment and costs about
one segment of steps plus building the trainer (DQN: 0.3 s). It imports the recipe the way the audit does — by module and attribute, found
where the running process got it — with the training process's import path, and with
:data:`IMPORT_ONLY` set, under which :func:`trainmaster.jobs.runtime.run` refuses to start a second
training (a script that trains at import, without ``if __name__ == "__main__":``).

Child command line (internal; the child is `jobs/selfcheck_child.py`, a separate module so that the
runtime never imports the replay machinery or the recipes, even lazily)::

    python -m trainmaster.jobs.selfcheck_child (--module NAME | --script PATH) --attr ATTR --result FILE

It reads one JSON line ``{"checkpoint_dir": …, "segment": i, "k": k}`` from stdin (end of input: it
exits quietly) and writes ``{"differ": [...]}`` or ``{"error": "..."}`` to ``FILE``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .execution import StateError
from .files import HostileFile, read_regular, read_tail
from .recipe import Recipe

IMPORT_ONLY = "TRAINMASTER_IMPORT_ONLY"
"""Set in processes that import a recipe to replay it: training must not start there."""
MESSAGE = "state() does not capture everything the next steps read"
NONDETERMINISTIC = (
    "the last segment does not replay bit for bit even within one fresh process — its steps are not a function of "
    "the state (a kernel without a deterministic implementation, a clock, an unseeded generator), which state() "
    "cannot fix; two replays differ in"
)
SHOWN = 5
"""Entries named in the message; the rest are counted."""
NICE = 10
TIMEOUT_FLOOR_S = 120.0
TIMEOUT_SEGMENTS = 20
"""The check may take this many times the last segment's training time, plus the floor."""
MODULE = "trainmaster.jobs.selfcheck_child"
MAX_RESULT_BYTES = 2**20
"""The check's result (a few mismatching entries); the recipe runs in that process, so it is read bounded."""
TAIL_BYTES = 64 * 1024


def _named(entries: list) -> str:
    more = f" and {len(entries) - SHOWN} more" if len(entries) > SHOWN else ""
    return f"{', '.join(map(str, entries[:SHOWN]))}{more}"


class SelfCheckError(StateError):
    """The run's last segment does not reproduce from its committed state in a fresh process."""


@dataclass(frozen=True)
class RecipeLocation:
    """Where a fresh process finds a recipe: a module by name, or the script being run, and the attribute."""

    attr: str
    module: str | None = None
    script: str | None = None

    def argv(self) -> list[str]:
        where = ["--module", self.module] if self.module else ["--script", str(self.script)]
        return [*where, "--attr", self.attr]


def locate(recipe: Recipe) -> RecipeLocation | None:
    """The module attribute that holds ``recipe`` in this process, or None (built in a function, say)."""
    preferred = getattr(recipe.build, "__module__", None)
    names = [preferred, *(name for name in list(sys.modules) if name != preferred)]
    main_module, main = sys.modules.get("__main__"), None
    for name in names:
        module = sys.modules.get(name) if name else None
        try:
            attrs = [attr for attr, value in vars(module).items() if value is recipe] if module is not None else []
        except TypeError:
            continue
        if not attrs:
            continue
        if module is not main_module:  # (also under an alias such as multiprocessing's __mp_main__)
            return RecipeLocation(attr=attrs[0], module=name)
        main = (module, attrs[0])
    if main is None:
        return None
    module, attr = main
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name not in (None, "__main__"):
        return RecipeLocation(attr=attr, module=spec.name)  # python -m package.train
    path = getattr(module, "__file__", None)
    return RecipeLocation(attr=attr, script=str(Path(path).resolve())) if path else None


class SelfCheck:
    """The fresh process of one run's self-check (parent side)."""

    def __init__(self, process: subprocess.Popen | None, workdir: tempfile.TemporaryDirectory, problem: str | None):
        self._process, self._workdir, self._problem = process, workdir, problem

    @classmethod
    def start(cls, recipe: Recipe) -> SelfCheck:
        """Start the process now, so its imports overlap training."""
        workdir = tempfile.TemporaryDirectory(prefix="trainmaster-selfcheck-")
        location = locate(recipe)
        if location is None:
            problem = (
                f"recipe {recipe.name!r} is not an attribute of a module a fresh process can import (define it at "
                "module level, as the spec's `recipe: module:attr` names it)"
            )
            return cls(None, workdir, problem)
        root = Path(workdir.name)
        path = [os.path.abspath(entry or os.curdir) for entry in sys.path if isinstance(entry, str)]
        env = {**os.environ, IMPORT_ONLY: "1", "PYTHONPATH": os.pathsep.join(path)}
        with open(root / "log", "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", MODULE, *location.argv(), "--result", str(root / "result.json")],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env, close_fds=True,
            )
        with contextlib.suppress(OSError, AttributeError):  # as the writer's threads: CPU training leaves idle
            os.setpriority(os.PRIO_PROCESS, process.pid, NICE)
        return cls(process, workdir, None)

    def check(self, checkpoint_dir: Path, segment: int, k: int, timeout_s: float) -> float:
        """Replay ``segment`` there and compare; raise :class:`SelfCheckError` unless it reproduces.
        Returns the seconds the parent waited."""
        if self._problem is not None:
            raise SelfCheckError(f"the self-check cannot run: {self._problem}")
        started = time.perf_counter()
        request = json.dumps({"checkpoint_dir": str(Path(checkpoint_dir).resolve()), "segment": segment, "k": k})
        with contextlib.suppress(BrokenPipeError):  # it ended already: its result (an import error) says why
            self._process.stdin.write(request.encode() + b"\n")
            self._process.stdin.close()
        try:
            code = self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            raise SelfCheckError(f"the self-check did not finish within {timeout_s:.0f} s") from None
        found = self._result()
        if found is None:
            raise SelfCheckError(f"the self-check process ended with code {code} and no result: {self._log_tail()}")
        if "error" in found:
            raise SelfCheckError(f"the self-check failed: {found['error']}")
        if unstable := found.get("nondeterministic"):
            raise SelfCheckError(f"{NONDETERMINISTIC}: {_named(unstable)}")
        if differ := found.get("differ"):
            raise SelfCheckError(f"{MESSAGE}: {_named(differ)}")
        return time.perf_counter() - started

    def close(self) -> None:
        """Stop the process if it still runs (the run failed before the check) and drop its files."""
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(BrokenPipeError):
                self._process.stdin.close()  # end of input: it exits once its imports are done
            try:
                self._process.wait(5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._workdir.cleanup()

    def _result(self) -> dict | None:
        try:
            found = json.loads(read_regular(Path(self._workdir.name) / "result.json", MAX_RESULT_BYTES))
        except (OSError, ValueError, HostileFile):
            return None
        return found if isinstance(found, dict) else None

    def _log_tail(self) -> str:
        try:
            tail = read_tail(Path(self._workdir.name) / "log", TAIL_BYTES)[0]
            lines = tail.decode(errors="replace").strip().splitlines()
        except (OSError, HostileFile):
            return "no output"
        return lines[-1][-500:] if lines else "no output"

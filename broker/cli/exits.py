"""Exit codes, and the one way a command prints to people, reports an error and exits.

0 success; 1 the thing asked about is bad (an invalid file, a failed job, no offer can run it);
2 usage or environment error (a missing file, an unknown job, an unreachable backend).
"""

from __future__ import annotations

import sys

import typer

OK, BAD, USAGE = 0, 1, 2


def console(*, stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, emoji=False)  # `p.yaml:100:` is a file and line, not an emoji code


def escape(text: str) -> str:
    """`text` printed as it is: control characters made visible, not read as Rich markup (paths and user
    values may hold brackets or terminal escapes; broker/cli/safe_text.py). Its line breaks are kept:
    a message of several problems is one per line."""
    from trainmaster.broker.cli.safe_text import markup

    return "\n".join(markup(line) for line in str(text).split("\n"))


def fail(message: str, code: int) -> None:
    console(stderr=True).print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def load(fn, *, usage_on_error: bool = False):
    """Run a loader; a missing file exits 2, an invalid one 1 (or 2 for environment files)."""
    try:
        return fn()
    except Exception as exc:
        if not _raised(exc, "trainmaster.jobs.yamlfile", "FileError"):
            raise
        missing = all(p.endswith(": no such file") or "no policy named" in p for p in exc.problems)
        fail(str(exc), USAGE if (missing or usage_on_error) else BAD)


# Our exceptions and how each is told, in the order they are tried: (module, class, message prefix, exit code).
FAILURES = (
    ("trainmaster.broker.planner", "PlanError", "", BAD),
    ("trainmaster.jobs.bundle", "BundleError", "cannot bundle the code: ", BAD),
    ("trainmaster.broker.store", "NotFound", "", USAGE),
    ("trainmaster.broker.store", "StateUnavailable", "", USAGE),
    ("trainmaster.storage.statedb", "BadDatabaseUrl", "TRAINMASTER_DATABASE_URL: ", USAGE),
    ("trainmaster.broker.service", "NothingToDo", "", USAGE),
    ("trainmaster.backends.base", "BackendError", "", USAGE),
    ("builtins", "OSError", "", USAGE),
    ("sqlite3", "OperationalError", "the state database: ", USAGE),  # a full disk, above all: never a traceback
)


def guarded(fn):
    """Run `fn`, mapping our exceptions to messages and exit codes, once, for every command."""
    try:
        return load(fn)  # FileError: 2 when missing, 1 when invalid
    except Exception as exc:
        for module, name, prefix, code in FAILURES:
            if _raised(exc, module, name):
                fail(prefix + (str(exc.args[0]) if name == "NotFound" else str(exc)), code)
        raise


def _raised(exc: BaseException, module: str, name: str) -> bool:
    """Whether `exc` is a `module.name`, without importing the module: an instance of a class exists only once
    its module is imported, so a command that never imported the planner pays nothing to be told apart from it."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(exc, getattr(loaded, name))

"""Exit codes, and the one way a command prints to people, reports an error and exits.

0 success; 1 the thing asked about is bad (an invalid file, a failed job, no offer can run it);
2 usage or environment error (a missing file, an unknown job, an unreachable backend).
"""

from __future__ import annotations

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
    from trainmaster.jobs.yamlfile import FileError

    try:
        return fn()
    except FileError as exc:
        missing = all(p.endswith(": no such file") or "no policy named" in p for p in exc.problems)
        fail(str(exc), USAGE if (missing or usage_on_error) else BAD)


def guarded(fn):
    """Run `fn`, mapping our exceptions to messages and exit codes, once, for every command."""
    from trainmaster.backends.base import BackendError
    from trainmaster.broker.planner import PlanError
    from trainmaster.broker.service import NothingToDo
    from trainmaster.broker.store import NotFound, StateUnavailable
    from trainmaster.jobs.bundle import BundleError

    try:
        return load(fn)  # FileError: 2 when missing, 1 when invalid
    except PlanError as exc:
        fail(str(exc), BAD)
    except BundleError as exc:
        fail(f"cannot bundle the code: {exc}", BAD)
    except NotFound as exc:
        fail(str(exc.args[0]), USAGE)
    except StateUnavailable as exc:
        fail(str(exc), USAGE)
    except NothingToDo as exc:
        fail(str(exc), USAGE)
    except (BackendError, OSError) as exc:
        fail(str(exc), USAGE)

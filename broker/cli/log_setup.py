"""The command line's one logging set-up: warnings (and more when asked) to stderr through Rich.

`configure` runs once per command, from the app's callback (`--verbose` / `-v`, `TRAINMASTER_LOG_LEVEL`):

- trainmaster's own loggers (`trainmaster.*`: the ledger, the outbox, the runtime) log at WARNING, at INFO
  with `-v`; `TRAINMASTER_LOG_LEVEL` (`debug`, `info`, `warning`, `error`) sets the level instead;
- the libraries' own loggers (aiohttp, botocore, boto3, bittensor, urllib3, asyncio) log errors only, unless
  DEBUG is asked for;
- one handler on the root logger writes `warning: message` lines through Rich to stderr; Rich is imported
  when the first line is written, so a command that logs nothing does not pay for it.
"""

from __future__ import annotations

import logging
import os

LEVEL_ENV = "TRAINMASTER_LOG_LEVEL"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
STYLES = {logging.CRITICAL: "bold red", logging.ERROR: "red", logging.WARNING: "yellow"}
LIBRARIES = ("aiohttp", "botocore", "boto3", "bittensor", "urllib3", "asyncio", "ray")


class RichStderr(logging.Handler):
    """Writes each record to stderr through Rich as `warning: message`, as `exits.fail` writes `error: …`;
    the console is made (and Rich imported) at the first record."""

    def __init__(self) -> None:
        super().__init__()
        self._console = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._console is None:
                from rich.console import Console

                self._console = Console(stderr=True)
            from rich.text import Text

            label = Text(f"{record.levelname.lower()}:", style=STYLES.get(record.levelno, "dim"))
            self._console.print(label, self.format(record), highlight=False, markup=False)  # folded to the width
        except Exception:  # noqa: BLE001 — logging must never break the command; Python's own handlers do this
            self.handleError(record)


def level_for(verbose: bool, environ: dict[str, str] | os._Environ = os.environ) -> int:
    """The level asked for: TRAINMASTER_LOG_LEVEL when set (an unknown name: WARNING), else INFO with `-v`."""
    named = environ.get(LEVEL_ENV, "").strip().lower()
    if named:
        return LEVELS.get(named, logging.WARNING)
    return logging.INFO if verbose else logging.WARNING


def configure(verbose: bool = False) -> None:
    """Set levels and the one stderr handler; idempotent (each command of one process calls it)."""
    _own_warnings()
    level = level_for(verbose)
    logging.getLogger("trainmaster").setLevel(level)
    for name in LIBRARIES:
        logging.getLogger(name).setLevel(logging.DEBUG if level <= logging.DEBUG else logging.ERROR)
    root = logging.getLogger()
    if not any(isinstance(handler, RichStderr) for handler in root.handlers):
        root.addHandler(RichStderr())
    named = os.environ.get(LEVEL_ENV, "").strip()
    if named and named.lower() not in LEVELS:
        logging.getLogger("trainmaster").warning("%s=%s is not one of %s; logging warnings", LEVEL_ENV, named,
                                                 ", ".join(LEVELS))


_SHOWN: set[str] = set()
_STALE: list = []
_ORIGINAL_SHOW = None


def _own_warnings() -> None:
    """trainmaster's own warnings as clean `warning: …` lines, each at most once per command, never with Python's
    file, line and source: the stale price catalogs (StaleCatalogWarning, raised each time a catalog loads) are
    gathered and said in one line as the command ends. Other libraries' warnings are shown as Python shows them."""
    global _ORIGINAL_SHOW
    import warnings

    if _ORIGINAL_SHOW is not None:
        return
    _ORIGINAL_SHOW = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not getattr(category, "__module__", "").startswith("trainmaster."):
            return _ORIGINAL_SHOW(message, category, filename, lineno, file, line)
        if category.__name__ == "StaleCatalogWarning" and hasattr(message, "path"):
            if not _STALE:
                import atexit

                atexit.register(_say_stale)
            _STALE.append(message)
            return None
        text = str(message)
        if text not in _SHOWN:
            _SHOWN.add(text)
            logging.getLogger("trainmaster").warning("%s", text)
        return None

    warnings.showwarning = show
    warnings.filterwarnings("always", module="trainmaster")  # shown (once, above) however often it is raised


def _say_stale() -> None:
    import sys

    load = sys.modules.get("trainmaster.backends.catalog.load")
    if load is None or not _STALE:
        return
    logging.getLogger("trainmaster").warning("%s", load.stale_summary(_STALE))

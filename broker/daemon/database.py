"""The state database as a dependency of the daemon, not its lifeline.

- **At start** `wait_for` tries to reach the database with exponential backoff (tenacity) for up to `--db-wait-s`
  seconds (default `START_WAIT_S`), saying each time why it cannot (the daemon's run file, which `daemon start`
  prints, and its log); a database that never comes fails the start with that reason.
- **While it runs** `Watch` knows whether the database answers: a probe on a connection of its own every
  `PROBE_S` seconds (every second while it is away), and every reconcile pass, report to it. While the database
  is away `/v1/health` says `degraded` with the reason, and the passes back off (broker/daemon/tasks.py); every
  connection the daemon holds opens again on its next use once the server is back (storage/dialects/postgresql.py),
  and the next pass carries on from what the database recorded, so nothing is lost or done twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from trainmaster.storage import statedb

log = logging.getLogger("trainmaster.daemon")

START_WAIT_S = 60.0
PROBE_S = 5.0


class DatabaseAway(RuntimeError):
    """The database did not answer within the wait."""


def reason(exc: BaseException) -> str:
    """One line saying why the database did not answer (a password never appears: libpq's messages hold none)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


def probe(where: Path | str) -> None:
    """Connect and run one query; the storage layer's error when the database does not answer."""
    db = statedb.connect(where)
    try:
        db.execute("SELECT 1").fetchone()
    finally:
        db.close()


def wait_for(where: Path | str, max_wait_s: float, on_wait: Callable[[str], None]) -> None:
    """Return once the database answers; `on_wait(reason)` after each failed try; `DatabaseAway` after
    `max_wait_s` seconds."""
    shown = statedb.shown(where)

    def told(state) -> None:
        why = reason(state.outcome.exception())
        log.warning("waiting for the database at %s: %s", shown, why)
        on_wait(f"waiting for the database at {shown}: {why}")

    try:
        for attempt in Retrying(stop=stop_after_delay(max_wait_s), wait=wait_exponential(multiplier=0.25, max=5),
                                retry=retry_if_exception_type(statedb.Error), before_sleep=told, reraise=False):
            with attempt:
                probe(where)
    except RetryError as exc:
        raise DatabaseAway(f"the database at {shown} did not answer within {max_wait_s:.0f} s: "
                           f"{reason(exc.last_attempt.exception())}") from None


class Watch:
    """Whether the database answers now, and since when it does not."""

    def __init__(self, where: Path | str):
        self.where = where
        self.problem: str | None = None
        self.since: float | None = None
        self.outages = 0
        self._db = None

    def failed(self, exc: BaseException) -> None:
        why = reason(exc)
        if self.problem is None:
            self.since = time.time()
            self.outages += 1
            log.error("the database at %s is away: %s; the daemon carries on when it is back",
                      statedb.shown(self.where), why)
        self.problem = why

    def answered(self) -> None:
        if self.problem is not None:
            log.info("the database at %s is back after %.0f s", statedb.shown(self.where),
                     time.time() - (self.since or time.time()))
        self.problem, self.since = None, None

    def check(self) -> None:
        """Probe now, on a connection of its own (opened again after the server dropped it); blocking: run it off
        the event loop."""
        try:
            self._db = self._db or statedb.connect(self.where)
            self._db.execute("SELECT 1").fetchone()
        except statedb.Error as exc:
            self.failed(exc)
        else:
            self.answered()

    def close(self) -> None:
        if self._db is not None:
            self._db.close()

    def status(self) -> list[str]:
        if self.problem is None:
            return []
        return [f"database: {statedb.shown(self.where)} is away since "
                f"{time.strftime('%H:%M:%S', time.localtime(self.since or time.time()))}: {self.problem}"]

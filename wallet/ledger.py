"""The spend ledger: append-only money movements in integer micro-USD and integer rao.

Three movements: `reserve` (on dispatch, the expected cost), `charge` (on acceptance, the actual
cost; settles the reservation) and `release` (on failure; settles it with nothing paid). Each has an
idempotency key, UNIQUE in the table, so a retried or resumed call finds its first row and changes
nothing; the same key with a different request is an error, never a second payment. A reservation
is settled at most once (a UNIQUE index on `reservation_key`).

A charge that pays an untrusted executor writes its payment (wallet/payments.py) in the same
transaction, keyed by the charge, so a payment exists exactly when its charge does.

Budgets are checked and the reservation written in one transaction that first locks the row of each
budget scope the reservation counts against (`ledger_scopes`; on SQLite the transaction is BEGIN IMMEDIATE,
one writer at a time), so concurrent submissions (threads, processes or hosts sharing a PostgreSQL server)
can never overshoot a hard cap; a charge or release locks the reservation it settles. The tables live in the
broker's state database beside its own, with their own schema version row; entries are never updated or
deleted (triggers refuse it).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trainmaster.storage import statedb
from trainmaster.jobs.money import display_usd
from trainmaster.wallet import alert_records, outbox, payments
from trainmaster.wallet.alerts import Alert, Overrun, log_alert
from trainmaster.wallet.budget import Budget
from trainmaster.wallet.spend import COLUMNS_GROUPED, GROUPS, SpendRow, charge_groups, spend_rows  # noqa: F401 — GROUPS, SpendRow, charge_groups: what callers import from here

log = logging.getLogger("trainmaster.wallet.ledger")

MIGRATIONS: list[list[str]] = [
    [  # 1: entries and alerts
        """CREATE TABLE ledger_entries (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            key TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL CHECK (kind IN ('reserve', 'charge', 'release')),
            reservation_key TEXT,
            job_id TEXT NOT NULL,
            backend TEXT NOT NULL,
            workload TEXT NOT NULL,
            project TEXT,
            micro_usd INTEGER NOT NULL CHECK (micro_usd >= 0),
            rao INTEGER NOT NULL CHECK (rao >= 0),
            rate_micro_usd_per_tao INTEGER CHECK (rate_micro_usd_per_tao > 0),
            at REAL NOT NULL,
            detail TEXT,
            CHECK ((kind = 'reserve') = (reservation_key IS NULL))
        )""",
        "CREATE UNIQUE INDEX ledger_settled ON ledger_entries(reservation_key) WHERE reservation_key IS NOT NULL",
        "CREATE INDEX ledger_kind_at ON ledger_entries(kind, at)",
        """CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger_entries
           BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END""",
        """CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger_entries
           BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END""",
        alert_records.CREATE,  # the budget alerts (wallet/alert_records.py)
    ],
    alert_records.DELIVERY,  # 2: webhook delivery, at least once (wallet/outbox.py)
    [  # 3: one row per budget scope, locked by each reservation that counts against it
        "CREATE TABLE ledger_scopes (budget TEXT PRIMARY KEY)",
    ],
]

Kind = Literal["reserve", "charge", "release"]
@dataclass(frozen=True)
class Entry:
    """One row of the ledger."""

    seq: int
    key: str
    kind: Kind
    reservation_key: str | None
    job_id: str
    backend: str
    workload: str
    project: str | None
    micro_usd: int
    rao: int
    rate_micro_usd_per_tao: int | None
    at: float
    detail: dict | None

    def describe(self) -> str:
        tao = f" + {self.rao} rao" if self.rao else ""
        return f"{self.kind} of {display_usd(self.micro_usd)}{tao} for job {self.job_id} on {self.backend}"


Reservation = Entry
"""What `reserve` returns: the reserve row (its `key` is what `charge` and `release` name)."""


@dataclass(frozen=True)
class Usage:
    spent_micro_usd: int
    reserved_micro_usd: int

    @property
    def used_micro_usd(self) -> int:
        return self.spent_micro_usd + self.reserved_micro_usd


class LedgerError(RuntimeError):
    pass


class BudgetExceeded(LedgerError):
    def __init__(self, budget: Budget, usage: Usage, request_micro_usd: int):
        self.budget, self.usage, self.request_micro_usd = budget, usage, request_micro_usd
        total = usage.used_micro_usd + request_micro_usd
        super().__init__(
            f"{budget.describe()} would be overshot: spent {display_usd(usage.spent_micro_usd)} + reserved "
            f"{display_usd(usage.reserved_micro_usd)} + this request {display_usd(request_micro_usd)} = "
            f"{display_usd(total)}, over the cap of {display_usd(budget.cap)}"
        )

    @property
    def by_spend(self) -> bool:
        """Whether what is spent alone leaves no room for the request (no settlement can make room this period);
        False when open reservations are what stand in the way (their settling may make room)."""
        return self.usage.spent_micro_usd + self.request_micro_usd > self.budget.cap


class IdempotencyConflict(LedgerError):
    """A key reused for a different movement: a bug in the caller, never a second payment."""


class UnknownReservation(LedgerError):
    pass


class AlreadySettled(LedgerError):
    pass


class Ledger:
    """The ledger in the state database at a location (a path or a `postgresql://` URL, opened with
    `statedb.connect`) or on an open connection (the broker's, configured by its owner)."""

    def __init__(
        self,
        path_or_conn: Path | str | Any,
        budgets: Sequence[Budget] = (),
        *,
        notify: Callable[[Alert], object] = log_alert,
        clock: Callable[[], float] = time.time,
    ):
        if isinstance(path_or_conn, (Path, str)):
            self.db, self._owned = statedb.connect(path_or_conn), True
        else:
            self.db, self._owned = path_or_conn, False
        self.budgets = list(budgets)
        self._notify, self._clock = notify, clock
        self._lock = threading.RLock()  # a connection shared between threads runs one transaction at a time
        self.deliveries: list[threading.Thread] = []
        """Webhook deliveries started by this ledger (threads that are not daemons; join to wait)."""
        self._migrate()
        if outbox.has_pending(self.db):  # alerts an earlier process could not deliver
            self._deliver()

    def close(self) -> None:
        if self._owned:
            self.db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def _tx(self, *, serialized: bool = False) -> Iterator[Any]:
        """A movement's transaction: it locks the rows it depends on (`serialized`: one writer at a time)."""
        with self._lock:
            if self.db.in_transaction:
                raise LedgerError("the ledger's connection is inside another transaction; commit it first")
            with statedb.immediate(self.db, serialized=serialized) as db:
                yield db

    def _migrate(self) -> None:
        with self._tx(serialized=True) as db:
            try:
                statedb.migrate(db, version_table="ledger_schema", migrations=MIGRATIONS, what="the ledger")
                payments.migrate(db)
            except statedb.SchemaTooNew as exc:
                raise LedgerError(str(exc)) from None

    # movements

    def reserve(
        self, key: str, *, job_id: str, backend: str, workload: str, project: str | None = None, micro_usd: int,
        rao: int = 0, rate_micro_usd_per_tao: int | None = None, detail: dict | None = None,
    ) -> Reservation:
        """Hold `micro_usd` for a dispatch; raises BudgetExceeded when a hard budget would be overshot."""
        _check_amounts(micro_usd, rao, rate_micro_usd_per_tao)
        request = dict(kind="reserve", reservation_key=None, job_id=job_id, backend=backend, workload=workload,
                       project=project, micro_usd=micro_usd, rao=rao, rate_micro_usd_per_tao=rate_micro_usd_per_tao)
        matching = [b for b in self.budgets if b.matches(backend=backend, workload=workload, project=project)]
        with self._tx() as db:
            _lock_scopes(db, key, matching)
            existing = _by_key(db, key)
            if existing is not None:
                return _replayed(existing, request)
            now = self._clock()
            for budget in matching:
                usage = _usage(db, budget, now)
                if budget.hard and usage.used_micro_usd + micro_usd > budget.cap:
                    raise BudgetExceeded(budget, usage, micro_usd)
            entry = _insert(db, key, request, now, detail)
            alerts = _record_alerts(db, matching, now)
        self._send(alerts)
        return entry

    def charge(
        self, key: str, *, reservation_key: str, micro_usd: int, rao: int = 0,
        rate_micro_usd_per_tao: int | None = None, detail: dict | None = None,
        payment: payments.PaymentOrder | None = None,
    ) -> Entry:
        """Record what was actually paid and settle the reservation. Never refused by a budget: the
        money is spent; a charge above its reservation is sent to the notifier as an `Overrun`, and can push a
        budget past its cap. `payment`: what the charge pays an untrusted executor, recorded in the same
        transaction and keyed by the charge (wallet/payments.py sends it, exactly once)."""
        _check_amounts(micro_usd, rao, rate_micro_usd_per_tao)
        with self._tx() as db:
            reservation, done = self._settle_target(
                db, key, reservation_key, "charge", micro_usd, rao, rate_micro_usd_per_tao
            )
            if done is not None:
                return done
            now = self._clock()
            entry = _insert(db, key, _settlement(reservation, "charge", micro_usd, rao, rate_micro_usd_per_tao), now, detail)
            if payment is not None:
                payments.record(db, charge_key=key, job_id=entry.job_id, order=payment, at=now)
            matching = [b for b in self.budgets
                        if b.matches(backend=entry.backend, workload=entry.workload, project=entry.project)]
            alerts = _record_alerts(db, matching, now)
        if overrun_matters(micro_usd, reservation.micro_usd):  # after the thresholds it crossed: the budget's news
            alerts.append(Overrun(reservation.job_id, micro_usd, reservation.micro_usd, tuple(b.label for b in matching)))
        self._send(alerts)
        return entry

    def release(self, key: str, *, reservation_key: str, detail: dict | None = None) -> Entry:
        """Settle a reservation with nothing paid (the attempt failed or was rejected)."""
        with self._tx() as db:
            reservation, done = self._settle_target(db, key, reservation_key, "release", 0, 0, None)
            if done is not None:
                return done
            return _insert(db, key, _settlement(reservation, "release", 0, 0, None), self._clock(), detail)

    def _settle_target(self, db, key, reservation_key, kind, micro_usd, rao, rate) -> tuple[Entry, Entry | None]:
        """The reservation a charge or release settles, or the earlier row when `key` is a retry."""
        reservation = _by_key(db, reservation_key, lock=True)
        if reservation is None or reservation.kind != "reserve":
            raise UnknownReservation(f"no reservation with key {reservation_key!r}")
        existing = _by_key(db, key)
        if existing is not None:
            return reservation, _replayed(existing, _settlement(reservation, kind, micro_usd, rao, rate))
        settled = db.execute("SELECT key, kind FROM ledger_entries WHERE reservation_key = ?", (reservation_key,)).fetchone()
        if settled is not None:
            raise AlreadySettled(f"reservation {reservation_key!r} was already settled by a {settled[1]} ({settled[0]!r})")
        return reservation, None

    def _send(self, alerts: list[Alert | Overrun]) -> None:
        for alert in alerts:
            try:
                self._notify(alert)
            except Exception as exc:  # alerting must never undo or fail a committed movement
                log.error("budget alert could not be sent: %s", exc)
        if any(alert.webhook for alert in alerts):
            self._deliver()

    def _deliver(self) -> None:
        """POST the pending alerts from a background thread, over its own connection to this file."""
        where = statedb.where(self.db)
        if where:  # an in-memory ledger has no file another connection could read
            self.deliveries.append(outbox.flush_in_background(where))

    # reading

    def usage(self, budget: Budget) -> Usage:
        """What counts against `budget` now: charges this period plus open reservations."""
        return _usage(self.db, budget, self._clock())

    def refusal(self, *, backend: str, workload: str, project: str | None, micro_usd: int) -> BudgetExceeded | None:
        """Why `reserve` would refuse this amount now (the first hard budget it would overshoot), or None.
        A preview only: the reservation itself checks again, in its own transaction."""
        now = self._clock()
        for budget in self.budgets:
            if budget.hard and budget.matches(backend=backend, workload=workload, project=project):
                usage = _usage(self.db, budget, now)
                if usage.used_micro_usd + micro_usd > budget.cap:
                    return BudgetExceeded(budget, usage, micro_usd)
        return None

    def spend(self, by: str | None = None, *, since: float | None = None, until: float | None = None) -> list[SpendRow]:
        """Actual spend (charges only), grouped by backend, class, job, project or month."""
        return spend_rows(self.db, by, since=since, until=until)

    def entries(self, *, job_id: str | None = None) -> list[Entry]:
        sql, args = "SELECT * FROM ledger_entries", ()
        if job_id is not None:
            sql, args = sql + " WHERE job_id = ?", (job_id,)
        return [_entry(row) for row in self.db.execute(sql + " ORDER BY seq", args).fetchall()]

    def entry(self, key: str) -> Entry | None:
        """The movement recorded under `key`, if any."""
        return _by_key(self.db, key)

    def outstanding(self) -> list[Reservation]:
        """Reservations not yet charged or released."""
        rows = self.db.execute(
            "SELECT * FROM ledger_entries r WHERE kind = 'reserve' AND NOT EXISTS"
            " (SELECT 1 FROM ledger_entries s WHERE s.reservation_key = r.key) ORDER BY seq"
        ).fetchall()
        return [_entry(row) for row in rows]


OVERRUN_MIN_MICRO_USD = 10_000
OVERRUN_MIN_FRACTION = 0.25
"""A charge above its reservation is told (an `Overrun`) only when it matters: by at least a cent and a quarter of
the reservation. A run a few seconds longer than its estimate is not news."""


def overrun_matters(charged: int, reserved: int) -> bool:
    over = charged - reserved
    return over >= OVERRUN_MIN_MICRO_USD and over >= OVERRUN_MIN_FRACTION * reserved


def _check_amounts(micro_usd: int, rao: int, rate: int | None) -> None:
    for name, value in (("micro_usd", micro_usd), ("rao", rao)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    if rao and rate is None:
        raise ValueError("an amount in rao needs the exchange rate used (rate_micro_usd_per_tao)")
    if rate is not None and (not isinstance(rate, int) or rate <= 0):
        raise ValueError(f"rate_micro_usd_per_tao must be a positive integer, got {rate!r}")


COLUMNS = ("key", "kind", "reservation_key", "job_id", "backend", "workload", "project", "micro_usd", "rao",
           "rate_micro_usd_per_tao", "at", "detail")


def _insert(db, key: str, request: dict, at: float, detail: dict | None) -> Entry:
    values = {**request, "key": key, "at": at, "detail": json.dumps(detail, sort_keys=True) if detail else None}
    seq = db.execute(
        f"INSERT INTO ledger_entries ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) RETURNING seq",
        [values[c] for c in COLUMNS],
    ).fetchone()[0]
    return Entry(seq=seq, **{**values, "detail": detail})


def _lock_scopes(db, key: str, budgets: list[Budget]) -> None:
    """Lock the movement's key and the row of each budget scope it counts against (in one order: no deadlock),
    so reservations against the same budget, or under the same key, run one after the other."""
    statedb.dialect(db).lock_key(db, key)
    labels = sorted({b.label for b in budgets})
    if not labels:
        return
    db.executemany("INSERT INTO ledger_scopes (budget) VALUES (?) ON CONFLICT DO NOTHING", [(label,) for label in labels])
    db.execute(f"SELECT budget FROM ledger_scopes WHERE budget IN ({','.join('?' * len(labels))}) ORDER BY budget"
               f"{statedb.dialect(db).FOR_UPDATE}", labels).fetchall()


def _settlement(reservation: Entry, kind: Kind, micro_usd: int, rao: int, rate: int | None) -> dict:
    return dict(kind=kind, reservation_key=reservation.key, job_id=reservation.job_id, backend=reservation.backend,
                workload=reservation.workload, project=reservation.project, micro_usd=micro_usd, rao=rao,
                rate_micro_usd_per_tao=rate)


def _replayed(existing: Entry, request: dict) -> Entry:
    """A retry returns the first row; the same key for a different movement is refused."""
    differs = [name for name, value in request.items() if getattr(existing, name) != value]
    if differs:
        raise IdempotencyConflict(
            f"key {existing.key!r} was already used for a {existing.describe()}; this request differs in "
            f"{', '.join(differs)} (a retry must repeat the same request; a new movement needs a new key)"
        )
    return existing


def _by_key(db, key: str, *, lock: bool = False) -> Entry | None:
    """The entry under `key`; `lock`: its row locked until the transaction ends."""
    row = db.execute(f"SELECT * FROM ledger_entries WHERE key = ?{statedb.dialect(db).FOR_UPDATE if lock else ''}",
                     (key,)).fetchone()
    return _entry(row) if row else None


def _entry(row: tuple) -> Entry:
    seq, *values = row
    entry = dict(zip(COLUMNS, values))
    entry["detail"] = json.loads(entry["detail"]) if entry["detail"] else None
    return Entry(seq=seq, **entry)


def _scope(budget: Budget) -> tuple[str, list]:
    where, args = [], []
    for column, value in (("backend", budget.backend), ("workload", budget.workload), ("project", budget.project)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    return (" AND ".join(where) or "TRUE"), args


def _usage(db, budget: Budget, now: float) -> Usage:
    scope, args = _scope(budget)
    spent = db.execute(
        f"SELECT COALESCE(SUM(micro_usd), 0) FROM ledger_entries WHERE kind = 'charge' AND at >= ? AND {scope}",
        [budget.period_start(now), *args],
    ).fetchone()[0]
    reserved = db.execute(
        f"SELECT COALESCE(SUM(micro_usd), 0) FROM ledger_entries r WHERE kind = 'reserve' AND {scope} AND NOT EXISTS"
        " (SELECT 1 FROM ledger_entries s WHERE s.reservation_key = r.key)",
        args,
    ).fetchone()[0]
    return Usage(spent, reserved)


def _record_alerts(db, budgets: list[Budget], now: float) -> list[Alert]:
    """Thresholds crossed, each recorded once per budget and period inside the movement's transaction."""
    fired = []
    for budget in budgets:
        used = _usage(db, budget, now).used_micro_usd
        start = budget.period_start(now)
        for percent in budget.alert_at_percent:
            if used * 100 < percent * budget.cap:
                break
            alert = Alert(budget=budget.label, percent=percent, period=budget.period, period_start=start,
                          cap_micro_usd=budget.cap, used_micro_usd=used, webhook=budget.webhook)
            if alert_records.record(db, budget=budget.label, period_start=start, percent=percent, used_micro_usd=used,
                                    at=now, webhook=alert.webhook, payload=json.dumps(alert.payload(), sort_keys=True)):
                fired.append(alert)
    return fired


# What others read of the ledger's entries (the broker's invariants, the daemon's metrics and dashboard, a TAO
# payment's check of its charge), each on a connection the caller holds: the one place outside `Ledger` the table is
# named in SQL (tests/repo/test_sql_owners.py). Each reads as empty while the ledger has made no table yet.

def usage(db, budget: Budget, now: float) -> Usage:
    """What `budget` counts now: charged in its period, and held (reserved, neither charged nor released)."""
    if not statedb.table_exists(db, "ledger_entries"):
        return Usage(0, 0)
    return _usage(db, budget, now)


def unsettled(db, keys: list[str]) -> set[str]:
    """Those of the reservations `keys` neither charged nor released."""
    if not keys or not statedb.table_exists(db, "ledger_entries"):
        return set()
    rows = db.execute(
        f"SELECT key FROM ledger_entries r WHERE key IN ({','.join('?' * len(keys))}) AND kind = 'reserve'"
        " AND NOT EXISTS (SELECT 1 FROM ledger_entries s WHERE s.reservation_key = r.key)", keys).fetchall()
    return {r[0] for r in rows}


def charged_by_backend(db) -> list[tuple[str, int, int]]:
    """(backend, micro-USD, rao) charged on each backend, ever."""
    return _rows(db, "SELECT backend, SUM(micro_usd), SUM(rao) FROM ledger_entries WHERE kind = 'charge'"
                     " GROUP BY backend ORDER BY backend")


def reserved_by_backend(db) -> list[tuple[str, int, int]]:
    """(backend, micro-USD, rao) held now on each backend: reservations not yet charged or released."""
    return _rows(db, "SELECT backend, SUM(micro_usd), SUM(rao) FROM ledger_entries r WHERE kind = 'reserve'"
                     " AND NOT EXISTS (SELECT 1 FROM ledger_entries s WHERE s.reservation_key = r.key)"
                     " GROUP BY backend ORDER BY backend")


def charges_since(db, since: float) -> list[tuple[float, str, int]]:
    """Each charge made since `since`: (when, backend, micro-USD), oldest first."""
    return _rows(db, "SELECT at, backend, micro_usd FROM ledger_entries WHERE kind = 'charge' AND at >= ?"
                     " ORDER BY at, seq", (since,))


def charged_rao(db, key: str) -> int | None:
    """The rao the charge `key` recorded (None when there is no such charge)."""
    row = db.execute("SELECT rao FROM ledger_entries WHERE key = ? AND kind = 'charge'", (key,)).fetchone()
    return None if row is None else row[0]


def _rows(db, sql: str, args: tuple = ()) -> list[tuple]:
    if not statedb.table_exists(db, "ledger_entries"):
        return []
    return [tuple(r) for r in db.execute(sql, args)]

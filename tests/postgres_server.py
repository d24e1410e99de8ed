"""A real PostgreSQL server for the tests and the benchmarks: one per test session, in a temp dir, on a free
port of 127.0.0.1 (trust authentication, fsync off), stopped by the pid it started; a fresh database per test.

The binaries are Debian's (`/usr/lib/postgresql/*/bin`, the `postgresql` package that `./dev install` puts in).
The server refuses to run as root: as root, it runs as the `postgres` user (`runuser -u postgres --`).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SETUP = "apt-get install -y --no-install-recommends postgresql (./dev install does it)"
USER = "tm"


class MissingServer(RuntimeError):
    """No PostgreSQL binaries on this machine."""


def binaries() -> Path:
    """The newest installed PostgreSQL's bin folder."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    if not found:
        raise MissingServer(f"no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: {SETUP}")
    return Path(found[-1]).parent


class PostgresServer:
    """A throwaway server: `start()`, `database()` for a fresh empty database's URL, `stop()`."""

    def __init__(self):
        self.bin = binaries()
        self.folder = Path(tempfile.mkdtemp(prefix="tm-postgres-"))  # not under pytest's 0700 tmp: `postgres` reads it
        self.port = _free_port()
        self.pid: int | None = None
        self._names = itertools.count(1)

    def start(self) -> PostgresServer:
        if self._as_user():
            shutil.chown(self.folder, "postgres")
        subprocess.run([*self._as_user(), str(self.bin / "initdb"), "-D", str(self.folder / "data"), "-A", "trust",
                        "-U", USER, "-E", "UTF8", "--no-sync"], check=True, capture_output=True)
        self.resume()
        return self

    @staticmethod
    def _as_user() -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _pg_ctl(self, *args: str) -> None:
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off"
                   " -c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
        subprocess.run([*self._as_user(), str(self.bin / "pg_ctl"), "-D", str(self.folder / "data"), "-o", options,
                        "-l", str(self.folder / "log"), "-w", "-t", "60", *args], check=True, capture_output=True)

    def halt(self) -> None:
        """Stop the server as an administrator would (`pg_ctl stop -m fast`: every session is ended), keeping its
        data for `resume`."""
        self._pg_ctl("-m", "fast", "stop")
        self.pid = None

    def resume(self) -> None:
        """Start the server again on its data and port."""
        self._pg_ctl("start")
        self.pid = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every session ended, the server back on the same port."""
        self._pg_ctl("-m", "fast", "restart")
        self.pid = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])

    def terminate_sessions(self, database: str) -> int:
        """`pg_terminate_backend` on every session of `database` but this one's; how many were ended."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as admin:
            return len(admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
                                     " AND pid <> pg_backend_pid()", (database,)).fetchall())

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new empty database (copied from template0, fast); its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.url(name)

    def stop(self) -> None:
        """A fast shutdown of the postmaster this server started (by its pid), then its folder removed."""
        if self.pid is not None:
            os.kill(self.pid, signal.SIGINT)
            deadline = time.monotonic() + 30
            while _alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(self.pid):
                os.kill(self.pid, signal.SIGQUIT)
            self.pid = None
        shutil.rmtree(self.folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

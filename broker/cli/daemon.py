"""`trainmaster daemon start|stop|status`: run the scheduler daemon, stop it, say how it is.

`start` detaches a `python -m trainmaster.broker.daemon` in its own session (its output to
`<home>/daemon/daemon.log`) and waits until its API answers; `--foreground` runs it in this process
(for systemd). `stop` sends SIGTERM (the daemon finishes the steps under way and releases their
leases), then SIGKILL after `--timeout` seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import typer

from trainmaster.broker.cli.exits import OK, USAGE, console, escape, fail

START_TIMEOUT_S = 30.0
daemon_app = typer.Typer(help="Run the scheduler daemon: it advances jobs and serves the API the CLI then uses.",
                         no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(daemon_app, name="daemon")


def _options(port: int, socket_path: str | None, workers: int, lease_s: float | None) -> list[str]:
    return ["--port", str(port), "--workers", str(workers), *(["--socket", socket_path] if socket_path else []),
            *(["--lease-s", str(lease_s)] if lease_s else [])]


@daemon_app.command()
def start(
    foreground: bool = typer.Option(False, "--foreground", help="Run in this process (systemd), not detached."),
    port: int = typer.Option(0, "--port", help="TCP port on 127.0.0.1 (0: a free one, written to the state file)."),
    socket_path: str = typer.Option(None, "--socket", help="Listen on this unix socket instead of TCP."),
    workers: int = typer.Option(4, "--workers", min=1, help="Jobs advanced at once."),
    lease_s: float = typer.Option(None, "--lease-s", help="A job lease's time to live in seconds (default 30): "
                                                         "how long a killed daemon's jobs wait to be taken over."),
) -> None:
    """Start the daemon (detached unless --foreground)."""
    from trainmaster.broker.cli.daemon_client import running

    if (found := running()) is not None:
        console().print(f"already running at {escape(found.address)}", highlight=False)
        raise typer.Exit(OK)
    if foreground:
        from trainmaster.broker.daemon.process import main

        main(_options(port, socket_path, workers, lease_s))
        return
    pid = _detach(_options(port, socket_path, workers, lease_s))
    found = _started(pid)
    if found is None:
        fail(f"the daemon (pid {pid}) did not answer within {START_TIMEOUT_S:.0f} s; see {_log_file()}", USAGE)
    console().print(f"daemon started: pid {pid}, {escape(found.address)}", highlight=False)


def _log_file():
    from trainmaster.broker.daemon.token import daemon_dir

    return daemon_dir() / "daemon.log"


def _detach(options: list[str]) -> int:
    log = _log_file()
    log.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.daemon", *options],
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    return child.pid


def _started(pid: int):
    """The daemon once it answers as `pid`; None when it died or did not answer in time."""
    from trainmaster.broker.cli.daemon_client import running

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = running()
        if found is not None and (found.health() or {}).get("pid") == pid:
            return found
        time.sleep(0.1)
    return None


@daemon_app.command()
def stop(timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait after SIGTERM before SIGKILL.")) -> None:
    """Stop the daemon gracefully (SIGTERM), killing it after --timeout seconds."""
    from trainmaster.broker.daemon import state

    found = state.read()
    if found is None:
        console().print("not running", highlight=False)
        return
    os.kill(found.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and state.read() is not None:
        time.sleep(0.1)
    if state.read() is not None:
        os.kill(found.pid, signal.SIGKILL)
        state.remove(found.pid)
        console().print(f"daemon {found.pid} did not stop within {timeout:.0f} s; killed", highlight=False)
        return
    console().print(f"daemon {found.pid} stopped", highlight=False)


@daemon_app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Whether the daemon runs: its pid, address, uptime and the jobs it is advancing."""
    from trainmaster.broker.cli.daemon_client import running

    found = running()
    health = found.health() if found else None
    if as_json:
        print(json.dumps({"running": health is not None, **(health or {})}, indent=2))
    elif health is None:
        console().print("not running", highlight=False)
    else:
        console().print(f"running: pid {health['pid']}, {escape(health['address'])}, up {health['uptime_s']:.0f} s, "
                        f"{len(health['in_flight'])} job(s) in flight {escape(' '.join(health['in_flight']))}",
                        highlight=False)
    raise typer.Exit(OK if health is not None else 3)

"""`trainmaster daemon start|stop|status|reload`: run the scheduler daemon, stop it, say how it is, re-read its files.

`start` detaches a `python -m trainmaster.broker.daemon` in its own session (its log rotated in
`<home>/daemon/daemon.log`) and follows its run file (broker/daemon/runs.py) until its API answers: it says what
the daemon waits for (the database), and why it did not start (a configuration file's `file:line` message, a
database that never came, another daemon holding the state); `--foreground` runs it in this process (for
systemd). `stop` sends SIGTERM to every daemon of the home (each finishes the steps under way and releases their
leases), then SIGKILL after `--timeout` seconds. `reload` has the daemon read its configuration files again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import typer

from trainmaster.broker.cli.exits import BAD, OK, USAGE, console, escape, fail

START_TIMEOUT_S = 30.0
NOT_RUNNING = 3
daemon_app = typer.Typer(help="Run the scheduler daemon: it advances jobs and serves the API the CLI then uses.",
                         no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(daemon_app, name="daemon")


def _options(port: int, socket_path: str | None, workers: int, lease_s: float | None, roots: list[str] | None,
             db_wait_s: float, max_connections: int) -> list[str]:
    return ["--port", str(port), "--workers", str(workers), *(["--socket", socket_path] if socket_path else []),
            *(["--lease-s", str(lease_s)] if lease_s else []),
            *[arg for root in roots or [] for arg in ("--root", os.path.abspath(root))],
            "--db-wait-s", str(db_wait_s), "--max-connections", str(max_connections)]


@daemon_app.command()
def start(
    foreground: bool = typer.Option(False, "--foreground", help="Run in this process (systemd), not detached."),
    port: int = typer.Option(0, "--port", help="TCP port on 127.0.0.1 (0: a free one, written to the state file)."),
    socket_path: str = typer.Option(None, "--socket", help="Listen on this unix socket instead of TCP."),
    workers: int = typer.Option(4, "--workers", min=1, help="Jobs advanced at once."),
    lease_s: float = typer.Option(None, "--lease-s", help="A job lease's time to live in seconds (default 30): "
                                                         "how long a killed daemon's jobs wait to be taken over."),
    roots: list[str] = typer.Option(None, "--root", help="A folder submissions may name spec and policy files "
                                                         "under (repeatable; default: your home and the temp dir)."),
    db_wait_s: float = typer.Option(60.0, "--db-wait-s", min=0, help="How long to wait for the database at start."),
    max_connections: int = typer.Option(1024, "--max-connections", min=8,
                                        help="Client connections at most (fewer when the open-file limit is low)."),
) -> None:
    """Start the daemon (detached unless --foreground)."""
    from trainmaster.broker.cli.daemon_client import running

    if (found := running()) is not None:
        console().print(f"already running at {escape(found.address)}", highlight=False)
        raise typer.Exit(OK)
    options = _options(port, socket_path, workers, lease_s, roots, db_wait_s, max_connections)
    if foreground:
        from trainmaster.broker.daemon.process import EXIT_HELD, main

        code = main(options)
        raise typer.Exit(OK if code in (0, EXIT_HELD) else code)
    child = _detach([*options, "--log-file", str(_log_file())])
    found = _started(child, START_TIMEOUT_S + db_wait_s)
    console().print(f"daemon started: pid {child.pid}, {escape(found.address)}", highlight=False)


def _log_file():
    from trainmaster.broker.daemon.token import daemon_dir

    return daemon_dir() / "daemon.log"


def _detach(options: list[str]) -> subprocess.Popen:
    """The daemon, started in a session of its own; what it writes outside its log (a crash of the interpreter
    itself) goes to `daemon.err` beside the log."""
    err = _log_file().with_name("daemon.err")
    err.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = "wb" if err.exists() and err.stat().st_size > 1024 * 1024 else "ab"
    with open(err, mode) as out:
        return subprocess.Popen([sys.executable, "-m", "trainmaster.broker.daemon", *options],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)


def _started(child: subprocess.Popen, timeout: float):
    """The daemon once it answers as `child`; what it waits for is said as it waits, and why it did not start ends
    the command (another daemon holding the state: exit 0, `already running`)."""
    from trainmaster.broker.cli.daemon_client import running
    from trainmaster.broker.daemon import runs

    deadline, said = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        run = runs.read(child.pid)
        code = child.poll()
        if code is not None:
            _clear(child.pid)
            if run is not None and run.phase == runs.HELD:
                console().print(f"already running: {escape(run.message)}", highlight=False, soft_wrap=True)
                raise typer.Exit(OK)
            if run is not None and run.phase == runs.FAILED:
                fail(f"the daemon did not start: {run.message}", USAGE)
            fail(f"the daemon (pid {child.pid}) exited with status {code} before it answered; see {_log_file()}",
                 USAGE)
        if run is not None and run.phase == runs.WAITING and run.message != said:
            said = run.message
            console(stderr=True).print(f"{escape(run.message)} (waiting up to {timeout - START_TIMEOUT_S:.0f} s)",
                                       highlight=False, soft_wrap=True)
        if run is not None and run.phase == runs.RUNNING:
            found = running()
            if found is not None and (found.health() or {}).get("pid") == child.pid:
                return found
        time.sleep(0.1)
    fail(f"the daemon (pid {child.pid}) did not answer within {timeout:.0f} s; see {_log_file()}", USAGE)


def _clear(pid: int) -> None:
    from trainmaster.broker.daemon import runs

    try:
        runs.run_file(pid).unlink()
    except OSError:
        pass


def _daemons() -> list[int]:
    """Every daemon of this home: the run files of live processes, and the one in the state file."""
    from trainmaster.broker.daemon import runs, state

    pids = [run.pid for run in runs.live()]
    found = state.read()
    if found is not None and found.pid not in pids:
        pids.append(found.pid)
    return pids


@daemon_app.command()
def stop(timeout: float = typer.Option(30.0, "--timeout", help="Seconds to wait after SIGTERM before SIGKILL.")) -> None:
    """Stop every daemon of this home gracefully (SIGTERM), killing those left after --timeout seconds."""
    from trainmaster.broker.daemon import runs, state

    pids = _daemons()
    if not pids:
        console().print("not running", highlight=False)
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    left = runs.wait_gone(pids, timeout)
    for pid in pids:
        if pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            state.remove(pid)
            _clear(pid)
            console().print(f"daemon {pid} did not stop within {timeout:.0f} s; killed", highlight=False)
        else:
            console().print(f"daemon {pid} stopped", highlight=False)
    runs.wait_gone(left, 10.0)


@daemon_app.command()
def status(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Whether the daemon runs: its pid, address, uptime, the jobs it is advancing, and what degrades it; every
    other daemon process of this home (starting, waiting for the database) too."""
    from trainmaster.broker.cli.daemon_client import running
    from trainmaster.broker.daemon import runs

    found = running()
    health = found.health() if found else None
    others = [r for r in runs.live() if not health or r.pid != health["pid"]]
    if as_json:
        print(json.dumps({"running": health is not None, **(health or {}),
                          "others": [{"pid": r.pid, "phase": r.phase, "message": r.message, "address": r.address}
                                     for r in others]}, indent=2))
        raise typer.Exit(OK if health is not None else NOT_RUNNING)
    out = console()
    if health is None:
        out.print("not running", highlight=False)
    else:
        out.print(f"running: pid {health['pid']}, {escape(health['address'])}, up {health['uptime_s']:.0f} s, "
                  f"{len(health['in_flight'])} job(s) in flight {escape(' '.join(health['in_flight']))}",
                  highlight=False)
        for problem in health.get("problems", []):
            out.print(f"  degraded: {escape(problem)}", highlight=False, soft_wrap=True)
    for run in others:
        out.print(f"  also pid {run.pid}: {escape(run.phase)}{': ' + escape(run.message) if run.message else ''}",
                  highlight=False, soft_wrap=True)
    raise typer.Exit(OK if health is not None else NOT_RUNNING)


@daemon_app.command()
def reload() -> None:
    """Have the daemon read its configuration files again now (backends.yaml, triggers.yaml, registry.yaml, your
    policies); a set that does not validate leaves the one in force, and the problems are printed (exit 1)."""
    from trainmaster.broker.cli.daemon_client import running

    found = running()
    if found is None:
        console().print("not running", highlight=False)
        raise typer.Exit(NOT_RUNNING)
    answer = found.call("POST", "/v1/reload")
    if answer["reloaded"]:
        console().print("configuration reloaded", highlight=False)
        return
    fail("the configuration files do not validate; the previous configuration stays in force:\n"
         + "\n".join(answer["problems"]), BAD)

"""Where trainmaster keeps things: `$TRAINMASTER_HOME`, else the platform's user data dir."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "TRAINMASTER_HOME"
DATABASE_URL_ENV = "TRAINMASTER_DATABASE_URL"


PRIVATE_UMASK = 0o077


def make_private() -> str | None:
    """Make what this process writes its user's alone (umask 0o077: files 0600, folders 0700) and tighten
    an existing home that others can enter to 0700; returns a note saying so when it did."""
    os.umask(PRIVATE_UMASK)
    root = home()
    if not root.is_dir():
        return None  # made later, private by the umask (or not a folder: the command says so)
    mode = root.stat().st_mode & 0o777
    if not mode & PRIVATE_UMASK:
        return None
    root.chmod(0o700)
    return f"{root} was readable by other users (mode {mode:04o}); it is now 0700"


def home() -> Path:
    override = os.environ.get(HOME_ENV)
    if override:
        return Path(override).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir("trainmaster", appauthor=False))


def config_dir() -> Path:
    """User policies and catalog overrides (`$TRAINMASTER_HOME/config` when the home is overridden)."""
    override = os.environ.get(HOME_ENV)
    if override:
        return home() / "config"
    import platformdirs

    return Path(platformdirs.user_config_dir("trainmaster", appauthor=False))


def state_db() -> Path | str:
    """Where the state lives: `$TRAINMASTER_DATABASE_URL` when set (`sqlite:////abs/path.db` or
    `postgresql://user@host:port/db`, a team server), else `state.db` in the home."""
    url = os.environ.get(DATABASE_URL_ENV)
    if not url:
        return home() / "state.db"
    from trainmaster.storage import statedb

    return statedb.location(url)


def job_dir(job_id: str) -> Path:
    return home() / "jobs" / job_id


def attempt_dir(job_id: str, n: int) -> Path:
    return job_dir(job_id) / "attempts" / str(n)


def bundles_dir() -> Path:
    return home() / "bundles"


def refreshed_catalogs_dir() -> Path:
    """Prices `trainmaster catalog refresh` pulled from the clouds' price APIs, one `<cloud>.csv` each: laid between
    the shipped catalogs and the user's own (`config_dir() / "catalogs"`), never edited by hand."""
    return home() / "catalogs"


def envs_dir() -> Path:
    """Job virtualenvs (`environment: {python: requirements}`), cached across jobs by their requirements' hash."""
    return home() / "envs"


def overlaps_home(path: Path) -> bool:
    """Whether `path` is the home, is inside it, or holds it: a code directory there would be bundled with
    `state.db` (challenge secrets, job environments) and sent to whoever runs the job."""
    here, root = Path(path).resolve(), home().resolve()
    return here == root or root in here.parents or here in root.parents

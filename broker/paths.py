"""Where trainmaster keeps things: `$TRAINMASTER_HOME`, else the platform's user data dir."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "TRAINMASTER_HOME"


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


def state_db() -> Path:
    return home() / "state.db"


def job_dir(job_id: str) -> Path:
    return home() / "jobs" / job_id


def attempt_dir(job_id: str, n: int) -> Path:
    return job_dir(job_id) / "attempts" / str(n)


def bundles_dir() -> Path:
    return home() / "bundles"


def envs_dir() -> Path:
    """Job virtualenvs (`environment: {python: requirements}`), cached across jobs by their requirements' hash."""
    return home() / "envs"

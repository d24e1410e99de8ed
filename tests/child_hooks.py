"""Hooks a wrapped CLI hands on to the Python processes it starts (tests/child_site/sitecustomize.py applies them):
a read's background pass (broker/cli/background.py) is a process of its own and must see the harness the command
saw."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).parent
HOOKS_ENV = "TRAINMASTER_TEST_HOOKS"


def hooked(hook: str) -> None:
    """The processes this one starts apply `hook` too: tests/child_site and tests/ on their PYTHONPATH, the hook
    named in TRAINMASTER_TEST_HOOKS."""
    os.environ.update(hook_env(hook))


def hook_env(hook: str) -> dict[str, str]:
    """The environment that hands `hook` on to the processes started with it (for monkeypatch.setenv)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE / "child_site"), str(HERE),
                                                        os.environ.get("PYTHONPATH")])),
            HOOKS_ENV: ",".join(filter(None, [os.environ.get(HOOKS_ENV), hook]))}

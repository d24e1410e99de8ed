"""The real `trainmaster` CLI, killed with SIGKILL (what kill -9 leaves) at a named point of a local launch.

    python tests/cli_kill_at.py POINT [trainmaster args…]

POINT:
- `prepare`: as the local backend starts to prepare an attempt (its launch lock made, nothing extracted, no keeper
  started): what a CLI killed between claiming the attempt and starting the supervisor leaves;
- `keeper`: right after the keeper process was started, before this process could wait for its supervisor;
- `referee-step`: in the refereed tier's bisection, right after its first step (both miners' openings of one leaf)
  was recorded, before the next is asked for.
"""

from __future__ import annotations

import os
import signal
import sys


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str) -> None:
    from trainmaster.backends.local.backend import LocalBackend

    if point == "prepare":
        def prepare(*args, **kwargs):
            _die()

        LocalBackend._prepare = prepare
    elif point == "keeper":
        from trainmaster.backends.local import launching

        original = launching.launch_once

        async def launch_once(workdir, prepare, start, **kwargs):
            def start_then_die():
                start()
                _die()

            return await original(workdir, prepare, start_then_die, **kwargs)

        launching.launch_once = launch_once
    elif point == "referee-step":
        from trainmaster.broker.stages import refereeing

        original_open = refereeing._open_both
        calls = []

        async def open_both(*args, **kwargs):
            if calls:  # the first step was opened and recorded: die before the second
                _die()
            calls.append(1)
            return await original_open(*args, **kwargs)

        refereeing._open_both = open_both
    else:
        raise SystemExit(f"unknown point {point!r}")


if __name__ == "__main__":
    arm(sys.argv[1])
    sys.argv = ["trainmaster", *sys.argv[2:]]
    from trainmaster.broker.cli import main

    main()

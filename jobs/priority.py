"""Background threads of the runtime yield the CPU to training."""

from __future__ import annotations

import contextlib
import os
import sys
import threading


def lower_thread_priority() -> None:
    """Make the calling thread yield the CPU to training (nice +10; Linux sets niceness per thread).

    Checkpoint threads then use what the training thread leaves idle instead of competing with it.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)

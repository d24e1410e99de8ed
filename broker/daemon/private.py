"""The daemon's own process kept from the other processes of its user: jobs among them.

A local job runs as the daemon's user, and `/proc/<pid>/environ` (and the memory behind `/proc/<pid>/mem`, or a
`ptrace`) of any process of the same user is open to it, unless that process is not *dumpable*. The daemon's
environment holds what only the broker may use (`TRAINMASTER_DATABASE_URL` with the database's password, tokens,
cloud credentials), so it makes itself non-dumpable (Linux `prctl(PR_SET_DUMPABLE, 0)`, as ssh-agent does): its
`/proc` files become root's, no core dump holds its memory, and a debugger needs root. What it starts is not
affected (an `execve` makes a process dumpable again), and jobs never get those variables anyway
(jobs/inherited.py). Nothing is done off Linux.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE, PR_GET_DUMPABLE = 4, 3


def not_dumpable() -> bool:
    """Make this process non-dumpable; whether it now is (False off Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0

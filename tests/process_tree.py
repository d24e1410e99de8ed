"""Killing a server the way a machine dies: SIGKILL to it and every process it started (detached training
supervisors and their jobs included), then waiting until all are gone."""

from __future__ import annotations

import signal
import subprocess


def kill_tree(proc: subprocess.Popen) -> int:
    """SIGKILL to `proc` and all its descendants; returns how many there were."""
    import psutil

    server = psutil.Process(proc.pid)
    victims = [server, *server.children(recursive=True)]
    for victim in victims:
        try:
            victim.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(victims, timeout=10)
    proc.wait()
    return len(victims)

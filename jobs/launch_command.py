"""How a job's entrypoint becomes the argv a machine runs: one process, or torchrun's processes.

Shared by the local backend's supervisor (backends/local/supervisor.py) and the container launcher
(jobs/launcher.py), so a job starts alike on this machine and in a cloud's container. Standard library and
`jobs.environment` only: both callers must start in milliseconds.
"""

from __future__ import annotations

import shlex
import socket
from collections.abc import Collection, Mapping

from trainmaster.jobs.environment import expand_command

TORCHRUN = "torchrun"
DIRECT = "direct"


def resolve_launcher(launcher: str, nproc: int, nnodes: int = 1) -> str:
    """The launcher a spec's `launcher` names: "auto" is torchrun for more than one process in all, else direct."""
    if launcher != "auto":
        return launcher
    return TORCHRUN if nproc > 1 or nnodes > 1 else DIRECT


def standalone_args(nproc: int) -> list[str]:
    """torchrun's options for one machine running `nproc` processes."""
    return ["--standalone", f"--nproc-per-node={nproc}"]


def rendezvous_args(*, nnodes: int, node_rank: int, master_addr: str, master_port: int, nproc: int) -> list[str]:
    """torchrun's options for one of `nnodes` machines meeting at `master_addr:master_port` (static rendezvous)."""
    return [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--master-addr={master_addr}",
            f"--master-port={master_port}", f"--nproc-per-node={nproc}"]


def command(entrypoint: str, *, python: str, python_names: Collection[str], env: Mapping[str, str],
            torchrun: list[str] | None = None) -> tuple[list[str], str]:
    """The argv to start, and the line a log shows: the entrypoint as written, since its expansion may hold a
    value from the inherited environment, which is never written to disk. A leading python name runs `python`;
    `torchrun` (its options) puts the entrypoint under `python -m torch.distributed.run`."""
    words = expand_command(entrypoint, env)
    if words[0] in python_names:
        words[0] = python
    prefix = [python, "-m", "torch.distributed.run", *torchrun, "--no-python"] if torchrun is not None else []
    return prefix + words, " ".join([*map(shlex.quote, prefix), entrypoint])


def single_process_env() -> dict[str, str]:
    """What torchrun would set for one process, so a script calling init_process_group still works."""
    return {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0",
        "ROLE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
    }


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

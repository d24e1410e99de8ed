"""A spot VM reclaimed right after a checkpoint segment, never racing the run's end.

The fakes preempt a job once its checkpoint folder holds a segment. Waiting for the segment in the bucket, between
uploads and 0.2 s sleeps, raced the run: a tiny run writes its segments and exits within half a second, and a poll
that missed that window let the job complete uninterrupted. Instead the fake watches the instance's own disk
(`segment_on_disk`, every `POLL_S`), freezes the instance the moment a manifest is there (`freeze`: SIGSTOP to its
processes, as a VM being reclaimed writes nothing more), lets the folder's sync finish, then reclaims it as the
platform does (SIGKILL, or SIGTERM after `thaw`)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

POLL_S = 0.01


def segment_on_disk(checkpoints: Path, segment: int | None = None) -> bool:
    """`checkpoints/segments/<segment>/manifest.json` exists (any segment's when `segment` is None)."""
    base = Path(checkpoints) / "segments"
    if segment is not None:
        return (base / f"{segment:08d}" / "manifest.json").is_file()
    return any(base.glob("*/manifest.json"))


def _tree(procs: list[subprocess.Popen]):
    import psutil

    for proc in procs:
        try:
            top = psutil.Process(proc.pid)
            yield from [top, *top.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue


def freeze(procs: list[subprocess.Popen]) -> list:
    """SIGSTOP to every process of the instances (they write nothing more); those processes, for `thaw`."""
    import psutil

    frozen = list(_tree(procs))
    for victim in frozen:
        try:
            victim.send_signal(signal.SIGSTOP)
        except psutil.NoSuchProcess:
            pass
    return frozen


def thaw(frozen: list) -> None:
    """SIGCONT to what `freeze` stopped (those still there): a signal sent meanwhile is then acted on."""
    import psutil

    for victim in frozen:
        try:
            victim.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass

"""Why a run under torchrun failed, in the words of the rank that failed first, not of torchrun's banner.

The supervisor starts torchrun with `--log-dir <attempt>/ranks --redirects 3 --tee 3`: every rank's stdout and
stderr go to a file of their own (`ranks/<run id>/attempt_<n>/<local rank>/stderr.log`) and, prefixed with
`[default<local rank>]:`, to the attempt's log as before. When a rank fails, torchrun ends the log with its report,
whose "Root Cause (first observed failure)" names the rank, its local rank and its exit code; the reason is then
that rank's last line on stderr (else on stdout, else its last line in the log): e.g. `rank 1 (local rank 1)
exited with code -6 (SIGABRT): terminate called without an active exception`.

Every file is read bounded and never through a link or a FIFO (the job runs beside them).
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from trainmaster.jobs.files import HostileFile, open_regular

RANKS_DIR = "ranks"
TAIL_BYTES = 8192
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):(?P<block>.*?)(?:\n=+|\Z)", re.S)
RANK = re.compile(r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:\s*(?P<local>\d+)\)")
EXIT = re.compile(r"exitcode\s*:\s*(?P<code>-?\d+)")
BANNER = re.compile(r"^[=\-*~_#+ ]*$")
"""A line of only rule characters: torchrun's banners, never a reason."""


def torchrun_args(workdir: Path) -> list[str]:
    """What the supervisor adds to torchrun's options so every rank's output is also kept apart."""
    return ["--log-dir", str(workdir / RANKS_DIR), "--redirects", "3", "--tee", "3"]


def failed_rank(workdir: Path, log_tail: str) -> str | None:
    """`rank R (local rank L) exited with code C (SIGNAME): its last error line`, from torchrun's root cause in
    `log_tail` (the end of the attempt's log) and that rank's own output; None when the log names no root cause."""
    found = None
    for found in ROOT_CAUSE.finditer(log_tail):
        pass
    if found is None:
        return None
    block = found["block"]
    rank, code = RANK.search(block), EXIT.search(block)
    if rank is None:
        return None
    said = f"rank {rank['rank']} (local rank {rank['local']})"
    if code is not None:
        said += f" exited with code {code['code']}" + _signal_name(int(code["code"]))
    line = _last_line(workdir, rank["local"], log_tail)
    return said + (f": {line[-500:]}" if line else "")


def last_meaningful(lines: list[str]) -> str | None:
    """The last line that is not a banner of rule characters."""
    return next((line for line in reversed(lines) if not BANNER.fullmatch(line)), None)


def _signal_name(code: int) -> str:
    if code >= 0:
        return ""
    try:
        return f" ({signal.Signals(-code).name})"
    except ValueError:
        return ""


def _last_line(workdir: Path, local_rank: str, log_tail: str) -> str | None:
    runs = workdir / RANKS_DIR
    for stream in ("stderr.log", "stdout.log"):
        for folder in _newest_first(runs, local_rank):
            line = last_meaningful(_tail_lines(folder / stream))
            if line:
                return line
    prefix = f"[default{local_rank}]:"
    return last_meaningful([line[len(prefix):].strip() for line in log_tail.splitlines() if line.startswith(prefix)])


def _newest_first(runs: Path, local_rank: str) -> list[Path]:
    """`<run id>/attempt_<n>/<local rank>` folders, the newest restart of the newest run first."""
    if not runs.is_dir() or runs.is_symlink():
        return []
    found = []
    for run in runs.iterdir():
        if run.is_symlink() or not run.is_dir():
            continue
        for attempt in run.glob("attempt_*"):
            folder = attempt / local_rank
            if folder.is_dir() and not folder.is_symlink():
                n = attempt.name.removeprefix("attempt_")
                found.append((run.stat().st_mtime, int(n) if n.isdigit() else -1, folder))
    return [folder for _, _, folder in sorted(found, reverse=True)]


def _tail_lines(path: Path) -> list[str]:
    try:
        fd, _ = open_regular(path)
    except (OSError, HostileFile):
        return []
    with os.fdopen(fd, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
        return [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]

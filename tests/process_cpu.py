"""Every process's CPU, by kind of process and by test file, for tests/benchmarks/bench_suite.py `--accounting`: what
tests/suite_cpu.py cannot see (a Ray cluster's daemons and workers, a local job's detached supervisor and training
process, servers kept for several tests: nobody in a test's tree waits for them) and what it lumps together.

Two records are joined:
- Linux's process accounting (`accton FILE`, root only, from Debian's `acct`): one 64-byte `acct_v3` record per
  process as it exits, with its pid, its parent's, its start and its CPU seconds, every process included;
- a start record per Python process (`hook_venv` puts a `.pth` file in the venv's site-packages, which Python runs
  at every start): its pid, its command line and the test it ran under (`PYTEST_CURRENT_TEST`, which pytest sets in
  its worker's environment for every test and its children inherit).

A process is attributed to the nearest start record up its parents (itself first): its kind is that record's
command line, its test the first test named on the way up. A process that is not Python, or a Python process
started without its site-packages (`-S`), has no record of its own: its kind is its nearest recorded ancestor's,
its own name in brackets (`ray start … [raylet]`). One that replaced a Python process (`exec`) keeps that process's
pid and so its command line.
"""

from __future__ import annotations

import re
import statistics
import struct
import subprocess
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

AHZ = 100
"""acct_v3's clock ticks per second."""
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
"""ac_flag, ac_version, ac_tty, ac_exitcode, ac_uid, ac_gid, ac_pid, ac_ppid, ac_btime, ac_etime, ac_utime,
ac_stime, ac_mem, ac_io, ac_rw, ac_minflt, ac_majflt, ac_swaps, ac_comm (linux/acct.h)."""
HOOK_MODULE = "_trainmaster_process_starts"
HOOK = '''"""Start records for tests/process_cpu.py (bench_suite --accounting): a line per Python process."""
import os


def record(target):
    try:
        with open("/proc/self/cmdline", "rb") as f:
            argv = f.read(600).replace(b"\\0", b" ").decode("utf-8", "replace")
        test = os.environ.get("PYTEST_CURRENT_TEST", "")[:300]
        fields = [str(os.getpid()), str(os.getppid()), repr(__import__("time").time()), argv, test]
        line = "\\t".join(field.replace("\\t", " ").replace("\\n", " ").strip() for field in fields) + "\\n"
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write of under PIPE_BUF: lines appended by many processes never mix
        finally:
            os.close(fd)
    except OSError:
        pass


record(%r)
'''
"""The recording module; the file's path is written into it (an environment variable would not reach the processes
started with an environment of their own: a Ray cluster's, a job's)."""


def hook_venv(python: Path, starts: Path) -> None:
    """Every later start of the venv of `python` appends its start record to `starts`."""
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    (purelib / f"{HOOK_MODULE}.py").write_text(HOOK % str(starts))
    (purelib / f"{HOOK_MODULE}.pth").write_text(f"import {HOOK_MODULE}\n")


def _comp_t(value: int) -> float:
    """acct's comp_t: a 13-bit mantissa and a 3-bit base-8 exponent, in clock ticks."""
    return float((value & 0x1FFF) << (3 * (value >> 13)))


@dataclass
class Exited:
    """One process-accounting record: a process that exited."""

    pid: int
    ppid: int
    start: int
    """Unix time, whole seconds."""
    elapsed_s: float
    cpu_s: float
    comm: str


def read_accounting(path: Path) -> list[Exited]:
    """The records of an accounting file (`accton FILE`)."""
    return read_accounting_bytes(path.read_bytes(), str(path))


def read_accounting_bytes(data: bytes, source: str = "accounting") -> list[Exited]:
    found = []
    for offset in range(0, len(data) - ACCT_V3.size + 1, ACCT_V3.size):
        (_, version, _, _, _, _, pid, ppid, btime, etime, utime, stime, *_rest, comm) = ACCT_V3.unpack_from(
            data, offset)
        if version & 0x7F != 3:
            raise ValueError(f"{source}: the record at byte {offset} is acct version {version & 0x7F}, not 3")
        found.append(Exited(pid, ppid, btime, etime / AHZ, (_comp_t(utime) + _comp_t(stime)) / AHZ,
                            comm.split(b"\0", 1)[0].decode("utf-8", "replace")))
    return found


def read_starts(path: Path) -> dict[int, list[dict]]:
    """The start records by pid (a pid is used again once its process is gone: several may share one). A line is
    `pid, ppid, time, command line, test`, tab-separated (no json: the hook imports nothing; 2-3 ms of CPU a
    process)."""
    starts: dict[int, list[dict]] = defaultdict(list)
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            fields = line.split("\t")
            try:
                pid, ppid, t = int(fields[0]), int(fields[1]), float(fields[2])
            except (ValueError, IndexError):
                continue
            starts[pid].append({"pid": pid, "ppid": ppid, "t": t, "argv": fields[3] if len(fields) > 3 else "",
                                "test": fields[4] if len(fields) > 4 else ""})
    return starts


def kind_of(argv: str) -> str:
    """A command line with its temporary paths and numbers folded, so the runs of one kind of process add up."""
    argv = re.sub(r"\S*/(?:site-packages|bin)/", "", argv)
    argv = re.sub(r"/tmp/\S+", "…", argv)
    argv = re.sub(r"\d+", "N", argv)
    return argv[:90]


@dataclass
class Attributed:
    by_kind: Counter
    runs_by_kind: Counter
    by_file: Counter
    total_s: float
    unattributed_s: float
    """CPU of processes no test was named above: pytest's own workers and what ran outside the tests."""


def attribute(exited: list[Exited], starts: dict[int, list[dict]]) -> Attributed:
    """Each exited process's CPU, by kind and by test file (see the module's docstring)."""
    by_pid: dict[int, list[Exited]] = defaultdict(list)
    for process in exited:
        by_pid[process.pid].append(process)
    # the kernel's start times come from its boot time, which may drift from the clock the start records read
    drift = statistics.median([starts[pid][0]["t"] - found[0].start for pid, found in by_pid.items()
                               if len(found) == 1 and len(starts.get(pid, ())) == 1] or [0.0])

    def start_record(process: Exited) -> dict | None:
        for record in starts.get(process.pid, []):  # the first Python start of this process, within its lifetime
            if process.start - 2 <= record["t"] - drift <= process.start + process.elapsed_s + 2:
                return record
        return None

    def parent(process: Exited, record: dict | None) -> Exited | None:
        """The process that started it: its start record's parent (a detached process's parent at its exit is
        init), else the accounting's."""
        ppid = record["ppid"] if record is not None else process.ppid
        for candidate in by_pid.get(ppid, []):
            if candidate.start - 1 <= process.start <= candidate.start + candidate.elapsed_s + 1:
                return candidate
        return None

    by_kind: Counter = Counter()
    runs: Counter = Counter()
    by_file: Counter = Counter()
    unattributed = 0.0
    for process in exited:
        kind = test = None
        current, hops = process, 0
        while current is not None and hops < 64 and test is None:
            record = start_record(current)
            if record is not None:
                kind = kind or (kind_of(record["argv"]) + ("" if current is process else f" [{process.comm}]"))
                test = record["test"] or None
            current, hops = parent(current, record), hops + 1
        kind = kind or f"[{process.comm}]"
        by_kind[kind] += process.cpu_s
        runs[kind] += 1
        if test:
            by_file[test.split("::", 1)[0]] += process.cpu_s
        else:
            unattributed += process.cpu_s
    return Attributed(by_kind, runs, by_file, sum(p.cpu_s for p in exited), unattributed)

"""The test suite's own budget (issue #34 item 6): a fresh clone's `./dev test`, install included, on this machine's
cores, and where its time goes.

Prints the wall time of the whole command, split into the install (and collection) and the tests' run, the
worker-seconds the tests took in all, and the ten slowest test files by worker-seconds (the sum of their tests'
setup, call and teardown, from pytest's JUnit XML). Target: the whole command within 20 minutes on 2 cores.

And where the CPU goes (a fresh clone's run): the seconds this machine's cores were busy during the command
(/proc/stat; with 2 cores, the tests need at least half that in wall time however they are spread: printed as
`cpu_floor_wall_s`, with `cores_busy_share`, how full the cores were over the command), and the ten
test files that used the most CPU in their own worker and in the processes they waited for (tests/suite_cpu.py;
a local job's detached supervisor and training process, and servers kept for several tests, are in the machine's
figure only). With `--accounting` (root, and Debian's `acct`), every process's CPU as well, from Linux's process
accounting (tests/process_cpu.py): the kinds of process that used the most (runs, and CPU per run), and the test
files whose processes did, detached ones and shared servers included; the fresh clone's Python records each start
(a line in a file: 2-3 ms of CPU a process).

And how fast the machine was meanwhile, since a shared VM's speed drifts by the hour (the yardstick below took
2.94 s of CPU at one hour and 3.14 s at another, the machine quiet both times, here): a yardstick, the CPU seconds
of `import torch, torch._dynamo` (what hundreds of the suite's processes do first; median of 5), before and after
the run, and the suite's wall time in yardsticks, a figure to compare runs by.

Run:
    python tests/benchmarks/bench_suite.py                # a fresh clone of HEAD into a temporary folder, `./dev test`
                                                          # there (its own .venv: pinned CPU torch, trainmaster[dev])
    python tests/benchmarks/bench_suite.py --save F.xml   # the same, keeping the fresh clone's JUnit XML report in F.xml
    python tests/benchmarks/bench_suite.py --junit F.xml  # only the summary, of a run already made with --junitxml
    python tests/benchmarks/bench_suite.py --accounting   # as root with Debian's `acct`: also every process's CPU,
                                                          # by kind and by test file (tests/process_cpu.py); with
                                                          # --save F.xml, its records kept as F.pacct, F.starts.tsv

The smoke run times this checkout's tests/repo/test_layout.py in the current interpreter (no clone, no install) and
summarises it the same way.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(1, str(Path(__file__).parents[1]))
import process_cpu  # noqa: E402
import suite_cpu  # noqa: E402
from _common import print_figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUDGET_S = 20 * 60
SHOWN = 10
SMOKE_FILE = "tests/repo/test_layout.py"


def _file_of(classname: str) -> str:
    """`tests.repo.test_layout.TestX` -> `tests/repo/test_layout.py` (JUnit's xunit2 names no file)."""
    parts = classname.split(".")
    while len(parts) > 1 and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def per_file(junit: Path) -> tuple[dict[str, float], dict[str, int], float]:
    """Worker-seconds and outcome counts by test file, and the run's own time, from a JUnit XML report."""
    seconds: dict[str, float] = defaultdict(float)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    for case in root.iter("testcase"):
        path = case.get("file") or _file_of(case.get("classname", "?"))
        seconds[path] += float(case.get("time") or 0.0)
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return dict(seconds), counts, sum(float(s.get("time") or 0.0) for s in suites)


def _fresh_clone(folder: Path) -> Path:
    clone = folder / "clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    return clone


YARDSTICK = "import torch, torch._dynamo"


def yardstick_s(repeat: int = 5) -> float:
    """The median CPU seconds (user + system) of a fresh `python -c YARDSTICK` in this interpreter."""
    samples = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", YARDSTICK], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(samples)


def speed_figures(before_s: float, after_s: float, wall_s: float, quiet: bool) -> dict[str, float]:
    figures = {"yardstick_before_s": round(before_s, 2), "yardstick_after_s": round(after_s, 2),
               "suite_wall_in_yardsticks": round(wall_s / ((before_s + after_s) / 2), 1)}
    if not quiet:
        print_figures(f"the machine's speed (yardstick: CPU seconds of `python -c '{YARDSTICK}'`, median of 5)",
                      figures, {})
    return figures


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, float, float | None]:
    """The command's exit code, its wall time and the CPU seconds this machine was busy meanwhile (None: unknown)."""
    busy, start = suite_cpu.machine_busy_s(), time.perf_counter()
    code = subprocess.call(argv, cwd=cwd, env=env)
    wall, after = time.perf_counter() - start, suite_cpu.machine_busy_s()
    return code, wall, (after - busy if busy is not None and after is not None else None)


def cpu_by_file(folder: Path) -> tuple[dict[str, float], float]:
    """CPU seconds by test file (their tests' workers and the children those waited for), and their sum."""
    spent: dict[str, float] = defaultdict(float)
    for line in suite_cpu.read(folder):
        spent[line["id"].split("::", 1)[0]] += line["self_s"] + line["children_s"]
    return dict(spent), sum(spent.values())


def summarise_cpu(folder: Path, busy_s: float | None, wall_s: float, quiet: bool) -> dict[str, float]:
    """The tests' CPU and the machine's; with the latter, how full the cores were (`cores_busy_share`: busy over
    cores × wall) and the wall time no spreading of the tests over workers can go below (`cpu_floor_wall_s`: busy
    over cores): when the cores were nearly always busy, only less CPU makes the suite faster."""
    spent, total = cpu_by_file(folder)
    most = sorted(spent.items(), key=lambda item: -item[1])[:SHOWN]
    figures = {"tests_cpu_s": round(total, 1)}
    cores = os.cpu_count() or 1
    if busy_s is not None:
        figures["machine_busy_s"] = round(busy_s, 1)
        figures["cores_busy_share"] = round(busy_s / (cores * wall_s), 3) if wall_s > 0 else 0.0
        figures["cpu_floor_wall_s"] = round(busy_s / cores, 1)
    if not quiet:
        print_figures("where the CPU goes", figures, {})
        print(f"\nthe {len(most)} files that used the most CPU (their workers and the processes they waited for)")
        for path, cpu in most:
            print(f"  {cpu:8.1f} s  {path}")
    return figures


ACCOUNTING_SHOWN = 25


def accounting_ready() -> str | None:
    """Why `--accounting` cannot run here (None: it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "--accounting needs root (Linux's process accounting: `accton`)"
    if shutil.which("accton") is None:
        return "--accounting needs `accton` (Debian: apt-get install acct)"
    return None


def summarise_processes(pacct: Path, starts: Path, quiet: bool) -> dict[str, float]:
    """Every process's CPU during the run (tests/process_cpu.py): by kind of process and by test file, detached
    processes and servers included."""
    found = process_cpu.attribute(process_cpu.read_accounting(pacct), process_cpu.read_starts(starts))
    figures = {"processes": sum(found.runs_by_kind.values()), "processes_cpu_s": round(found.total_s, 1),
               "outside_tests_cpu_s": round(found.unattributed_s, 1)}
    if not quiet:
        print_figures("every process's CPU (process accounting)", figures, {})
        print(f"\nthe {ACCOUNTING_SHOWN} kinds of process that used the most CPU (CPU-s, runs, per run)")
        for kind, cpu in found.by_kind.most_common(ACCOUNTING_SHOWN):
            runs = found.runs_by_kind[kind]
            print(f"  {cpu:8.1f} s {runs:6d} {cpu / runs:6.2f}  {kind}")
        print(f"\nthe {SHOWN} files whose processes used the most CPU (whoever waited for them)")
        for path, cpu in found.by_file.most_common(SHOWN):
            print(f"  {cpu:8.1f} s  {path}")
    return figures


def summarise(junit: Path, wall_s: float | None, quiet: bool) -> dict[str, float]:
    seconds, counts, tests_s = per_file(junit)
    slowest = sorted(seconds.items(), key=lambda item: -item[1])[:SHOWN]
    figures: dict[str, float] = {}
    if wall_s is not None:
        figures["suite_wall_s"] = round(wall_s, 1)
        figures["install_and_collection_s"] = round(max(wall_s - tests_s, 0.0), 1)
    figures.update({
        "tests_run_s": round(tests_s, 1),
        "worker_seconds": round(sum(seconds.values()), 1),
        "test_files": len(seconds),
        "passed": counts["passed"],
        "failed": counts["failed"],
        "skipped": counts["skipped"],
        "cores": os.cpu_count() or 1,
    })
    if not quiet:
        print_figures("test suite", figures, {"suite_wall_s": f"≤ {BUDGET_S} s on 2 cores, install included",
                                              "failed": "0", "skipped": "0"})
        print(f"\nthe {len(slowest)} slowest files (worker-seconds: setup + call + teardown of their tests)")
        for path, spent in slowest:
            print(f"  {spent:8.1f} s  {path}")
    for i, (_, spent) in enumerate(slowest, 1):
        figures[f"slowest_file_{i}_s"] = round(spent, 1)
    return figures


def run(smoke: bool = False, junit: Path | None = None, save: Path | None = None,
        accounting: bool = False) -> dict[str, float]:
    if junit is not None:
        return summarise(junit, None, quiet=False)
    if accounting and (why := accounting_ready()):
        raise SystemExit(why)
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        report = Path(tmp) / "junit.xml"
        if smoke:
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", SMOKE_FILE,
                    f"--junitxml={report}", f"--basetemp={Path(tmp) / 'basetemp'}"]
            cpu_folder = Path(tmp) / "cpu"
            before = yardstick_s(1)
            code, wall, busy = _timed(argv, ROOT, {**os.environ, suite_cpu.ENV: str(cpu_folder)})
            if code != 0:
                raise SystemExit(f"the smoke run of tests/repo failed (exit {code})")
            return {**summarise(report, wall, quiet=True), **summarise_cpu(cpu_folder, busy, wall, quiet=True),
                    **speed_figures(before, yardstick_s(1), wall, quiet=True)}
        clone = _fresh_clone(Path(tmp))
        cpu_folder = Path(tmp) / "cpu"
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "TRAINMASTER_VENV", "PYTHONPATH")}
        env[suite_cpu.ENV] = str(cpu_folder)
        pacct, starts = Path(tmp) / "pacct", Path(tmp) / "starts.tsv"
        if accounting:  # the venv `./dev` would make, made first, so that its Python records every start
            subprocess.run([env.get("PYTHON", "python3"), "-m", "venv", str(clone / ".venv")], check=True)
            process_cpu.hook_venv(clone / ".venv" / "bin" / "python", starts)
        before = yardstick_s()
        if accounting:
            pacct.touch()
            subprocess.run(["accton", str(pacct)], check=True, stdout=subprocess.DEVNULL)
        try:
            code, wall, busy = _timed(["./dev", "test", "-p", "no:cacheprovider", f"--junitxml={report}"], clone,
                                      env)
        finally:
            if accounting:
                subprocess.run(["accton", "off"], check=False, stdout=subprocess.DEVNULL)
        print(f"\n`./dev test` in a fresh clone exited {code} after {wall:.0f} s")
        if save is not None and report.is_file():
            shutil.copyfile(report, save)
        if save is not None and accounting:  # beside it, to look into a kind of process or a file further
            for kept in (pacct, starts):
                if kept.is_file():
                    shutil.copyfile(kept, save.with_name(f"{save.stem}.{kept.name}"))
        figures = summarise(report, wall, quiet=False)
        figures.update(summarise_cpu(cpu_folder, busy, wall, quiet=False))
        if accounting:
            figures.update(summarise_processes(pacct, starts, quiet=False))
        figures.update(speed_figures(before, yardstick_s(), wall, quiet=False))
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--junit", type=Path, help="summarise this JUnit XML report instead of running the suite")
    parser.add_argument("--save", type=Path, help="keep the fresh clone's JUnit XML report here")
    parser.add_argument("--accounting", action="store_true",
                        help="also every process's CPU, by kind and by test file (root, Debian's acct)")
    args = parser.parse_args()
    run(junit=args.junit, save=args.save, accounting=args.accounting)


if __name__ == "__main__":
    main()

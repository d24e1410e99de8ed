"""Every process's CPU (tests/process_cpu.py, printed by tests/benchmarks/bench_suite.py --accounting): Linux's
process-accounting records (laid out and encoded as the kernel's `struct acct_v3`), joined with the start records a
hooked venv writes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import process_cpu
import pytest
from repo_paths import TESTS

AT = 1_800_000_000
ACCT_VERSION = 3


def comp_t(ticks: int) -> int:
    """acct's comp_t encoding (kernel/acct.c encode_comp_t): 13 bits of mantissa, 3 of base-8 exponent."""
    exponent = 0
    while ticks > 0x1FFF:
        ticks, exponent = (ticks + 4) >> 3, exponent + 1  # rounded as the kernel rounds
    return (exponent << 13) | ticks


def record(pid: int, ppid: int, start: int, elapsed_s: float, cpu_s: float, comm: str) -> bytes:
    ticks = round(cpu_s * process_cpu.AHZ)
    return process_cpu.ACCT_V3.pack(0, ACCT_VERSION, 0, 0, 0, 0, pid, ppid, start, elapsed_s * process_cpu.AHZ,
                                    comp_t(ticks - ticks // 4), comp_t(ticks // 4), 0, 0, 0, 0, 0, 0,
                                    comm.encode())


DRIFT_S = 30.0
"""How far the clock the start records read is from the kernel's start times (its boot time drifts)."""


def start(pid: int, ppid: int, t: float, argv: str, test: str = "") -> str:
    return "\t".join([str(pid), str(ppid), repr(t + DRIFT_S), argv, test]) + "\n"


def test_the_record_is_the_kernels_acct_v3_and_its_cpu_reads_back():
    assert process_cpu.ACCT_V3.size == 64  # sizeof(struct acct_v3), linux/acct.h
    [one, large] = process_cpu.read_accounting_bytes(record(7, 1, AT, 2.5, 1.25, "python")
                                                     + record(8, 1, AT, 900.0, 700.0, "raylet"))
    assert (one.pid, one.ppid, one.start, one.elapsed_s, one.comm) == (7, 1, AT, 2.5, "python")
    assert abs(one.cpu_s - 1.25) < 0.02
    assert abs(large.cpu_s - 700.0) / 700.0 < 0.01  # past 8,191 ticks comp_t keeps 13 significant bits


def test_a_record_of_another_version_is_refused_with_its_place():
    data = bytearray(record(7, 1, AT, 1.0, 1.0, "python"))
    data[1] = 2
    with pytest.raises(ValueError, match="the record at byte 0 is acct version 2, not 3"):
        process_cpu.read_accounting_bytes(bytes(data))


def a_run(tmp_path: Path) -> tuple[Path, Path]:
    """The accounting and start records of a worker, a test's CLI, the server it detached and that server's
    non-Python child, and a later test that got the CLI's pid again."""
    worker, cli, daemon, raylet, reused = 100, 200, 300, 301, 200
    pacct = tmp_path / "pacct"
    pacct.write_bytes(b"".join([
        record(worker, 1, AT, 100.0, 40.0, "python"),                 # the pytest worker: no test above it
        record(cli, worker, AT + 10, 5.0, 1.5, "python"),             # a CLI a test ran
        record(daemon, 1, AT + 11, 60.0, 20.0, "python"),             # a server it detached (init's at its exit)
        record(raylet, daemon, AT + 12, 50.0, 9.0, "raylet"),         # a non-Python child of that server
        record(reused, worker, AT + 80, 3.0, 2.0, "python"),          # pid 200 again, for another test
    ]))
    starts = tmp_path / "starts.tsv"
    starts.write_text("".join([
        start(worker, 1, AT + 0.1, "python -u -c import sys;exec(eval(sys.stdin.readline()))"),
        start(cli, worker, AT + 10.1, "python -m trainmaster.broker.cli submit /tmp/a/b --wait",
              "tests/x/test_a.py::test_one (call)"),
        start(daemon, cli, AT + 11.1, "python -m trainmaster.broker.daemon --port 0"),  # started with a bare env
        "a line of another kind\n",
        start(reused, worker, AT + 80.1, "python train.py --steps 12", "tests/y/test_b.py::test_two (setup)"),
    ]))
    return pacct, starts


def test_detached_and_non_python_processes_count_for_the_test_above_them(tmp_path):
    pacct, starts = a_run(tmp_path)
    found = process_cpu.attribute(process_cpu.read_accounting(pacct), process_cpu.read_starts(starts))
    assert abs(found.by_file["tests/x/test_a.py"] - 30.5) < 0.1  # the CLI, its detached daemon and the raylet
    assert abs(found.by_file["tests/y/test_b.py"] - 2.0) < 0.1  # the reused pid is the later test's
    assert abs(found.unattributed_s - 40.0) < 0.1
    assert abs(found.total_s - 72.5) < 0.1
    assert found.runs_by_kind["python -m trainmaster.broker.daemon --port N [raylet]"] == 1
    assert found.runs_by_kind["python -m trainmaster.broker.cli submit … --wait"] == 1
    assert found.runs_by_kind["python train.py --steps N"] == 1


def test_a_hooked_venv_records_every_python_start_even_with_an_environment_of_its_own(tmp_path):
    venv, starts = tmp_path / "venv", tmp_path / "starts.tsv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    process_cpu.hook_venv(python, starts)
    child = f"import subprocess; subprocess.run([{str(python)!r}, '-c', 'pass'], env={{}}, check=True)"
    env = {**os.environ, "PYTEST_CURRENT_TEST": "tests/z/test_c.py::test_three (call)"}
    done = subprocess.run([str(python), "-c", child], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    [first], [second] = process_cpu.read_starts(starts).values()
    assert first["test"] == "tests/z/test_c.py::test_three (call)" and first["argv"].endswith(child)
    assert second["ppid"] == first["pid"] and second["test"] == ""  # recorded, its test found above it
    assert Path(second["argv"].split()[0]).name == "python"


def bench_suite():
    spec = importlib.util.spec_from_file_location("bench_suite", TESTS / "benchmarks" / "bench_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_prints_the_kinds_and_files_with_their_cpu(tmp_path, capsys):
    pacct, starts = a_run(tmp_path)
    figures = bench_suite().summarise_processes(pacct, starts, quiet=False)
    assert figures == {"processes": 5, "processes_cpu_s": 72.5, "outside_tests_cpu_s": 40.0}
    printed = capsys.readouterr().out
    assert "      20.0 s      1  20.00  python -m trainmaster.broker.daemon --port N\n" in printed
    assert "       9.0 s      1   9.00  python -m trainmaster.broker.daemon --port N [raylet]\n" in printed
    assert "      30.5 s  tests/x/test_a.py\n" in printed and "       2.0 s  tests/y/test_b.py\n" in printed


def test_the_benchmark_refuses_accounting_it_cannot_do_before_it_clones_anything():
    """Run as a user runs it, with no `accton` on PATH (and, on a machine that is not root's, not root)."""
    done = subprocess.run([sys.executable, str(TESTS / "benchmarks" / "bench_suite.py"), "--accounting"],
                          env={**os.environ, "PATH": str(Path(sys.executable).parent)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("--accounting needs "), done.stderr
    assert "fresh clone" not in done.stdout + done.stderr


def test_the_benchmark_says_why_it_cannot_count_every_process(monkeypatch):
    bench_suite_module = bench_suite()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "needs root" in bench_suite_module.accounting_ready()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(bench_suite_module.shutil, "which", lambda name: None)
    assert "apt-get install acct" in bench_suite_module.accounting_ready()
    monkeypatch.setattr(bench_suite_module.shutil, "which", lambda name: f"/usr/sbin/{name}")
    assert bench_suite_module.accounting_ready() is None

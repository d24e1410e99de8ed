"""Time and peak memory of `trainmaster verify DIR` on the worst hostile outputs of issue #24.

Each case is an outputs folder built cheaply (tests/hostile_support.py: sparse files, one compressed
member shared by many zip entries) and judged by `trainmaster verify DIR --json`, run as a child of a
fresh wrapper process that reports the child's wall time and peak RSS (``RUSAGE_CHILDREN``). Before
the fix a 3 GB commitment took 22.6 s and 3.4 GB, a sparse 50 GB one raised MemoryError, the
200-entry zip took 49 s, a FIFO result.json hung, a 1,200-deep tree gave "cannot verify".
Target for each case: at most 10 s and 500 MB, and the verdict `rejected` (the huge metrics step is
data for `verify DIR`: `accepted`; the live status line's handling of it is in tests/verify/test_hostile_bytes.py).
The CPU seconds (of the CLI and its children) and the harmless baseline (a folder of one log file:
the CLI's own start-up and imports) show what the hostile case itself costs on a loaded machine.
`run(smoke=True)` builds four small cases.

Run: python tests/benchmarks/bench_hostile.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))
import hostile_support as hostile  # noqa: E402
from _common import print_figures  # noqa: E402

GB, MIB = 10**9, 2**20

WRAPPER = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
seconds = time.perf_counter() - start
used = resource.getrusage(resource.RUSAGE_CHILDREN)
peak, cpu = used.ru_maxrss / 1024, used.ru_utime + used.ru_stime
try:
    outcome = json.loads(done.stdout)["outcome"]
except ValueError:
    outcome = f"no verdict (exit {done.returncode}): {done.stderr.strip()[-200:]}"
print(json.dumps({"seconds": seconds, "cpu_s": cpu, "peak_mb": peak, "outcome": outcome}))
"""


def _cases(smoke: bool) -> dict[str, Callable[[Path], object]]:
    full = {
        "baseline_harmless": lambda d: None,
        "commitment_3GB": lambda d: hostile.sparse(d / "commitment.json", 3 * GB),
        "commitment_50GB": lambda d: hostile.sparse(d / "commitment.json", 50 * GB),
        "result_3GB": lambda d: hostile.sparse(d / "result.json", 3 * GB),
        "secret_link": lambda d: hostile.secret_link(d),
        "zip_200x64MiB": lambda d: hostile.zip_bomb(d / "model.zip", entries=200, member_mib=64),
        "zip_65535x64MiB": lambda d: hostile.zip_bomb(d / "model.zip", entries=65_535, member_mib=64),
        "tree_1200_deep": lambda d: hostile.deep_tree(d, 1200),
        "fifo_result": lambda d: hostile.fifo(d / "result.json"),
        "fifo_metrics": lambda d: hostile.fifo(d / "metrics.jsonl"),
        "tensor_0x2e100": lambda d: hostile.tensor_file(d / "model.safetensors", [0, 2**100]),
        "metrics_step_1e400": lambda d: hostile.huge_step_metrics(d / "metrics.jsonl"),
    }
    if not smoke:
        return full
    return {
        "baseline_harmless": lambda d: None,
        "commitment_3GB": lambda d: hostile.sparse(d / "commitment.json", 3 * MIB),
        "zip_200x64MiB": lambda d: hostile.zip_bomb(d / "model.zip", entries=20, member_mib=1),
        "tree_1200_deep": lambda d: hostile.deep_tree(d, 100),
        "fifo_result": lambda d: hostile.fifo(d / "result.json"),
    }


def measure(outputs: Path) -> dict:
    """`trainmaster verify OUTPUTS --json` in a fresh wrapper: wall and CPU seconds, peak MB, the verdict."""
    command = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "trainmaster.broker.cli", "verify", str(outputs), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(done.stdout)


def run(smoke: bool = False) -> dict[str, float]:
    figures, targets, verdicts = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        for name, build in _cases(smoke).items():
            outputs = hostile.outputs(Path(tmp) / name / "outputs")
            build(outputs)
            found = measure(outputs)
            figures[f"{name}_s"], targets[f"{name}_s"] = found["seconds"], "<= 10"
            figures[f"{name}_cpu_s"] = found["cpu_s"]
            figures[f"{name}_peak_MB"], targets[f"{name}_peak_MB"] = found["peak_mb"], "<= 500"
            verdicts[name] = found["outcome"]
            hostile.remove_deep_tree(outputs)
    print_figures("trainmaster verify DIR on hostile outputs (wall time of the CLI process, its peak RSS)", figures, targets)
    print("\nverdicts")
    for name, outcome in verdicts.items():
        print(f"  {name:<20}  {outcome}")
    return figures


if __name__ == "__main__":
    run()

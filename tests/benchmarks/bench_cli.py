"""`trainmaster --help` start-up time, median of 10, beside `python -c pass`.

Target ≤ 0.10 s (for comparison: `sky --help` ≈ 1.35 s and `dstack --help` ≈ 0.77 s on a 2-core machine).
Run: python tests/benchmarks/bench_cli.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import median_seconds, print_figures  # noqa: E402


def trainmaster_command() -> list[str]:
    script = Path(sys.executable).parent / "trainmaster"
    found = str(script) if script.exists() else shutil.which("trainmaster")
    return [found] if found else [sys.executable, "-m", "trainmaster.broker.cli"]


def run(smoke: bool = False) -> dict[str, float]:
    repeat = 2 if smoke else 10
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "check": True}
    help_s = median_seconds(lambda: subprocess.run([*trainmaster_command(), "--help"], **quiet), repeat)
    bare_s = median_seconds(lambda: subprocess.run([sys.executable, "-c", "pass"], **quiet), repeat)
    return {"trainmaster --help (s)": help_s, "python -c pass (s)": bare_s, "difference (s)": help_s - bare_s}


if __name__ == "__main__":
    print_figures("CLI start-up, median of 10", run(), {"trainmaster --help (s)": "≤ 0.10"})

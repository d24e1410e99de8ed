"""Peak memory of `check_file` on a large checkpoint.

The figure: peak memory while `trainmaster.verify.safeload.check_file` verifies a ~1 GiB safetensors
file of 8 float32 tensors (largest 256 MiB) — header, offsets, and every value for NaN/Inf. It is
measured in a fresh subprocess as its peak RSS (VmHWM, reset through /proc/self/clear_refs after
the imports) minus its RSS just before the call (Linux only). Target: below 2 × largest tensor + 100 MiB.
`load_checked`, which returns the tensors, is measured the same way: it should need one copy of the
tensors and no more. `run(smoke=True)` does the same over ~20 MiB.

Run: python tests/benchmarks/bench_safeload.py
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import print_figures  # noqa: E402

MIB = 1024 * 1024
FULL_MIB = [256, 192, 160, 128, 96, 80, 64, 48]  # 1024 MiB
SMOKE_MIB = [5, 4, 3, 2, 2, 2, 1, 1]  # 20 MiB
PATTERN_MIB = 4

CHILD = """
import json, sys, time
import torch  # load_checked imports it; keep that out of the measurement
from trainmaster.verify import safeload

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current RSS
baseline = status("VmRSS")
start = time.perf_counter()
result = getattr(safeload, sys.argv[2])(sys.argv[1])
seconds = time.perf_counter() - start
print(json.dumps({"rise_kib": status("VmHWM") - baseline, "seconds": seconds, "tensors": len(result.tensors if sys.argv[2] == "check_file" else result)}))
"""


def run(smoke: bool = False) -> dict[str, float]:
    sizes = SMOKE_MIB if smoke else FULL_MIB
    with tempfile.TemporaryDirectory(prefix="bench-safeload-") as tmp:
        path = _write_checkpoint(Path(tmp) / "model.safetensors", sizes)
        total = path.stat().st_size
        checked, loaded = _measure(path, "check_file"), _measure(path, "load_checked")
    largest = max(sizes)
    return {
        "file (MiB)": total / MIB,
        "tensors": float(checked["tensors"]),
        "largest tensor (MiB)": float(largest),
        "check_file peak memory rise (MiB)": checked["rise_kib"] / 1024,
        "target: 2 x largest + 100 (MiB)": 2.0 * largest + 100,
        "check_file (MiB/s, page cache warm)": total / MIB / checked["seconds"],
        "load_checked peak memory rise (MiB)": loaded["rise_kib"] / 1024,
    }


def _measure(path: Path, function: str) -> dict:
    """Run ``safeload.<function>(path)`` in a fresh interpreter and return its memory and time."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), function], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _write_checkpoint(path: Path, sizes_mib: list[int]) -> Path:
    """A safetensors file of float32 tensors written in slices, never whole in this process's memory."""
    import torch

    header, offset = {}, 0
    for i, size in enumerate(sizes_mib):
        nbytes = size * MIB
        header[f"layer{i}.weight"] = {"dtype": "F32", "shape": [nbytes // 4 // 1024, 1024], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    pattern = torch.randn(PATTERN_MIB * MIB // 4, generator=torch.Generator().manual_seed(0)).numpy().tobytes()
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(raw)) + raw)
        for size in sizes_mib:
            remaining = size * MIB
            while remaining:
                piece = pattern[: min(remaining, len(pattern))]
                handle.write(piece)
                remaining -= len(piece)
    return path


if __name__ == "__main__":
    figures = run(smoke="--smoke" in sys.argv)
    print_figures("safe loading: peak memory on a large checkpoint", figures,
                  {"check_file peak memory rise (MiB)": "< 2 x largest tensor + 100 MiB",
                   "load_checked peak memory rise (MiB)": "~ the file: one copy of the tensors"})

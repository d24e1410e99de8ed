"""GPU models by canonical name, and their relative training throughput (A100 = 1.0).

The figures are rough, backend-agnostic ratios of mixed-precision training throughput per GPU,
from public benchmarks (MLPerf Training, vendor whitepapers); they rank offers and turn a runtime
measured on one GPU into an estimate on another, nothing finer. A GPU not in the table is assumed
to run at the reference speed, and the planner says so.
"""

from __future__ import annotations

import re
from functools import lru_cache

REFERENCE = "A100"

THROUGHPUT: dict[str, float] = {
    "B200": 5.0,
    "H200": 3.3,
    "H100": 3.0,
    "A100": 1.0,
    "L40S": 0.8,
    "RTX 4090": 0.75,
    "L40": 0.6,
    "A40": 0.5,
    "RTX A6000": 0.5,
    "V100": 0.45,
    "RTX 3090": 0.45,
    "A10": 0.35,
    "L4": 0.35,
    "A10G": 0.3,
    "P100": 0.2,
    "T4": 0.12,
}

# Longest names first, so "A100" is found before "A10" and "RTX A6000" before "A6000".
_MODELS = sorted(THROUGHPUT, key=len, reverse=True)
_TOKENS = re.compile(r"[A-Za-z0-9]+")


@lru_cache(maxsize=512)
def canonical_gpu(name: str) -> str:
    """The table's name for a GPU as backends report it ("NVIDIA A100-SXM4-80GB" → "A100"); unknown
    names come back upper-cased and stripped of a vendor prefix, so equal names still compare equal."""
    words = " ".join(_TOKENS.findall(name.upper()))
    for model in _MODELS:
        if re.search(rf"(?<![A-Z0-9]){re.escape(model)}(?![A-Z0-9])", words):
            return model
    return re.sub(r"^(NVIDIA|TESLA|GEFORCE|AMD)\s+", "", words)


def throughput(gpu_type: str | None) -> float | None:
    """Relative speed of one GPU of this type, or None when the table does not know it."""
    if gpu_type is None:
        return None
    return THROUGHPUT.get(canonical_gpu(gpu_type))


def gpu_matches(gpu_type: str | None, wanted: list[str] | tuple[str, ...]) -> bool:
    """Whether a GPU is one of the wanted models (empty `wanted`: any)."""
    if not wanted:
        return True
    if gpu_type is None:
        return False
    return canonical_gpu(gpu_type) in {canonical_gpu(w) for w in wanted}

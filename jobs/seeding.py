"""Randomness as a pure function of ``(job seed, step, stream)``, and the global RNG states.

Every random draw a training step makes comes from a generator derived here, so step ``s``
of a job draws the same numbers on any machine, in any process, after any resume. The
runtime also re-seeds the global generators (python ``random``, numpy's legacy global, torch's
default generator) at the start of every step, so code that uses them (``nn.Dropout``,
``random.random()``) is covered too.

The derivation (documented in docs/runtime.md, "Step seeds")::

    digest = sha256(b"trainmaster-step-seed-v1\\x00" + seed as i64 LE + step as i64 LE + stream UTF-8)
    derived = int.from_bytes(digest[:8], "little")          # an unsigned 64-bit integer
"""

from __future__ import annotations

import hashlib
import random
import struct

import numpy as np
import torch

_DOMAIN = b"trainmaster-step-seed-v1\x00"
GLOBAL_STREAM = "global"


def derive_seed(seed: int, step: int, stream: str) -> int:
    """The unsigned 64-bit seed of ``stream`` at ``step`` of a job seeded with ``seed``."""
    digest = hashlib.sha256(_DOMAIN + struct.pack("<qq", seed, step) + stream.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little")


def step_generator(seed: int, step: int, stream: str) -> torch.Generator:
    """A torch CPU generator for ``stream`` at ``step``."""
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, step, stream))
    return generator


def step_rng(seed: int, step: int, stream: str) -> np.random.Generator:
    """A numpy PCG64 generator for ``stream`` at ``step``."""
    return np.random.Generator(np.random.PCG64(derive_seed(seed, step, stream)))


def seed_globals(seed: int, step: int, stream: str = GLOBAL_STREAM) -> None:
    """Seed python's, numpy's and torch's global generators for ``step``."""
    derived = derive_seed(seed, step, stream)
    random.seed(derived)
    np.random.seed(derived % 2**32)  # the legacy global generator takes 32-bit seeds only
    torch.default_generator.manual_seed(derived)  # torch.manual_seed also walks lazy CUDA/XPU hooks: ms a call
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(derived)


def capture_global_rng() -> dict[str, torch.Tensor]:
    """The states of the three global generators, as tensors (for the training state)."""
    version, mt, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python/version": torch.tensor(version, dtype=torch.int64),
        "python/mt": torch.tensor(mt, dtype=torch.int64),
        "python/gauss_next": torch.tensor([] if gauss_next is None else [gauss_next], dtype=torch.float64),
        "numpy/keys": torch.from_numpy(keys.astype(np.int64)),
        "numpy/pos": torch.tensor(pos, dtype=torch.int64),
        "numpy/has_gauss": torch.tensor(has_gauss, dtype=torch.int64),
        "numpy/cached_gaussian": torch.tensor(cached, dtype=torch.float64),
        "torch/state": torch.get_rng_state(),
    }


def restore_global_rng(tensors: dict[str, torch.Tensor]) -> None:
    """Put back what :func:`capture_global_rng` captured."""
    gauss = tensors["python/gauss_next"].tolist()
    random.setstate(
        (int(tensors["python/version"]), tuple(tensors["python/mt"].tolist()), gauss[0] if gauss else None)
    )
    np.random.set_state(
        (
            "MT19937",
            tensors["numpy/keys"].numpy().astype(np.uint32),
            int(tensors["numpy/pos"]),
            int(tensors["numpy/has_gauss"]),
            float(tensors["numpy/cached_gaussian"]),
        )
    )
    torch.set_rng_state(tensors["torch/state"].clone())

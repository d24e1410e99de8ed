"""Canonical serialization of a flat ``name -> tensor`` mapping: the bytes every state hash covers.

The canonical form is itself a valid safetensors file, so the checkpoint on disk *is* the hashed
serialization (hash while writing, no second encoding) and ``sha256(weights file)`` is the
committed ``sha256(weights_i)``. Layout (docs/runtime.md, "Canonical serialization"):

* ``u64`` little-endian header length ``N``, then ``N`` bytes of header, then the data.
* Header: ``json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`` of
  ``{"__metadata__": {"format": FORMAT}, name: {"data_offsets": [b, e], "dtype": D, "shape": [...]}}``,
  right-padded with spaces to a multiple of 8 bytes.
* Data: each tensor's C-order little-endian bytes, in sorted name order (python ``str`` order,
  i.e. code point order), back to back, offsets relative to the start of the data.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import sys
from collections.abc import Iterable, Mapping

import numpy as np
import torch

if sys.byteorder != "little":  # tensors are written from memory as they are
    raise ImportError("trainmaster.jobs.canonical needs a little-endian platform")

FORMAT = "trainmaster-canonical-v1"
MAX_HEADER_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 64 * 1024 * 1024

DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_CODES = {code: dtype for dtype, code in DTYPES.items()}
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]+")


class CanonicalError(ValueError):
    """A state entry that has no canonical serialization."""


def canonical_tensors(state: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """Check every entry and return CPU, dense, C-contiguous, detached tensors in sorted name order.

    Accepts torch tensors and numpy arrays of the dtypes in :data:`DTYPES`. A non-contiguous
    tensor is serialized as its C-order copy; anything else (python objects, object arrays,
    complex or unsigned >8-bit dtypes, sparse or quantized tensors) raises :class:`CanonicalError`.
    """
    return {name: _canonical_tensor(name, state[name]) for name in sorted(_checked_names(state))}


def _checked_names(state: Mapping[str, object]) -> list[str]:
    for name in state:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name.startswith("__"):
            raise CanonicalError(
                f"state name {name!r} is not canonical: use [A-Za-z0-9_.:/-]+, not starting with '__'"
            )
    return list(state)


def _canonical_tensor(name: str, value: object) -> torch.Tensor:
    if (  # the common case, checked cheaply: a dense contiguous CPU tensor of a supported dtype
        isinstance(value, torch.Tensor)
        and value.dtype in DTYPES
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type == "cpu"
        and value.is_contiguous()
    ):
        return value.detach()
    if isinstance(value, np.ndarray):
        value = _numpy_to_tensor(name, value)
    if not isinstance(value, torch.Tensor):
        raise CanonicalError(f"state entry {name!r} is a {type(value).__name__}, not a tensor or array")
    if value.layout != torch.strided or value.is_quantized or value.is_meta:
        raise CanonicalError(f"state entry {name!r} is not a dense tensor (layout {value.layout})")
    if value.dtype not in DTYPES:
        raise CanonicalError(f"state entry {name!r} has unsupported dtype {value.dtype}")
    return value.detach().cpu().contiguous()


def _numpy_to_tensor(name: str, array: np.ndarray) -> torch.Tensor:
    if array.dtype.hasobject or not array.dtype.isnative:
        raise CanonicalError(f"state entry {name!r} is a numpy array of dtype {array.dtype}")
    try:
        return torch.from_numpy(np.ascontiguousarray(array))
    except TypeError as exc:
        raise CanonicalError(f"state entry {name!r} has unsupported numpy dtype {array.dtype}") from exc


def header_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The length prefix and padded JSON header for tensors already in canonical order."""
    header: dict[str, object] = {"__metadata__": {"format": FORMAT}}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"data_offsets": [offset, offset + size], "dtype": DTYPES[tensor.dtype], "shape": list(tensor.shape)}
        offset += size
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a canonical tensor."""
    if tensor.numel() == 0:
        return memoryview(b"")
    if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16
        tensor = tensor.view(torch.int16)
    return memoryview(tensor.numpy()).cast("B")


def chunks(tensors: Mapping[str, torch.Tensor]) -> list[memoryview]:
    """The canonical serialization as byte views (header first), each at most :data:`CHUNK_BYTES`."""
    views = [memoryview(header_bytes(tensors))]
    for tensor in tensors.values():
        view = tensor_bytes(tensor)
        if len(view) <= CHUNK_BYTES:
            views.append(view)
        else:
            views.extend(view[i : i + CHUNK_BYTES] for i in range(0, len(view), CHUNK_BYTES))
    return views


def views(state: Mapping[str, object]) -> list[memoryview]:
    """The canonical serialization of ``state`` as zero-copy views into its tensors (header first)."""
    return chunks(canonical_tensors(state))


def serialize(state: Mapping[str, object]) -> bytes:
    """The canonical bytes of ``state``."""
    return b"".join(views(state))


def sha256_of(views: Iterable[memoryview], hasher: hashlib._Hash | None = None) -> hashlib._Hash:
    """Feed byte views into a sha256 hasher (a new one unless given) and return it."""
    hasher = hasher or hashlib.sha256()
    for view in views:
        hasher.update(view)
    return hasher


def state_sha256(state: Mapping[str, object]) -> str:
    """Lowercase hex sha256 of the canonical serialization of ``state``."""
    return sha256_of(views(state)).hexdigest()


def deserialize(data: bytes | bytearray) -> dict[str, torch.Tensor]:
    """Parse canonical bytes, refusing anything that is not exactly canonical.

    The header is bounded (:data:`MAX_HEADER_BYTES`), parsed strictly, and must be byte-identical
    to the canonical header of the tensors it describes; the data must be fully indexed.
    """
    if len(data) < 8:
        raise CanonicalError("truncated: no header length")
    (length,) = struct.unpack_from("<Q", data)
    if length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise CanonicalError(f"header length {length} is out of bounds for {len(data)} bytes")
    try:
        header = json.loads(bytes(data[8 : 8 + length]).decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CanonicalError(f"header is not ASCII JSON: {exc}") from exc
    if not isinstance(header, dict) or header.pop("__metadata__", None) != {"format": FORMAT}:
        raise CanonicalError(f"header does not declare format {FORMAT}")
    tensors = {name: _entry_tensor(name, entry, data, 8 + length) for name, entry in sorted(header.items())}
    if header_bytes(tensors) != bytes(data[: 8 + length]):
        raise CanonicalError("header is not in canonical form")
    end = 8 + length + sum(t.numel() * t.element_size() for t in tensors.values())
    if end != len(data):
        raise CanonicalError(f"data is {len(data) - 8 - length} bytes, header indexes {end - 8 - length}")
    return tensors


def _entry_tensor(name: str, entry: object, data: bytes | bytearray, start: int) -> torch.Tensor:
    try:
        dtype = _CODES[entry["dtype"]]  # type: ignore[index]
        shape = [int(d) for d in entry["shape"]]  # type: ignore[index]
        begin, end = (int(o) for o in entry["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError) as exc:
        raise CanonicalError(f"header entry {name!r} is malformed: {entry!r}") from exc
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if min(shape, default=0) < 0 or end - begin != count * torch.empty(0, dtype=dtype).element_size():
        raise CanonicalError(f"header entry {name!r} has offsets that do not match its shape")
    if start + end > len(data):
        raise CanonicalError(f"tensor {name!r} runs past the end of the data")
    raw = bytearray(data[start + begin : start + end])
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape) if raw else torch.empty(shape, dtype=dtype)

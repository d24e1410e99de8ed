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

import ctypes
import hashlib
import json
import math
import re
import struct
import sys
from collections.abc import Iterable, Mapping

import numpy as np
import torch

from .canonical_header import FORMAT, header_for

if sys.byteorder != "little":  # tensors are written from memory as they are
    raise ImportError("trainmaster.jobs.canonical needs a little-endian platform")

MAX_HEADER_BYTES = 16 * 1024 * 1024
HEADER_DEPTH = 3
"""A canonical header nests ``{name: {"shape": [...]}}``: deeper is refused before parsing."""
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


def canonical_layout(state: Mapping[str, object]) -> dict[str, torch.Tensor]:
    """As :func:`canonical_tensors`, but a tensor on a GPU stays there (C-contiguous, detached): the
    entries of a state in canonical order, each checked, for a copier that moves them itself
    (``jobs/host_copy.py``)."""
    return {name: _canonical_tensor(name, state[name], host=False) for name in sorted(_checked_names(state))}


def _checked_names(state: Mapping[str, object]) -> list[str]:
    for name in state:
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name) or name.startswith("__"):
            raise CanonicalError(
                f"state name {name!r} is not canonical: use [A-Za-z0-9_.:/-]+, not starting with '__'"
            )
    return list(state)


def _canonical_tensor(name: str, value: object, host: bool = True) -> torch.Tensor:
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
    return (value.detach().cpu() if host else value.detach()).contiguous()


def _numpy_to_tensor(name: str, array: np.ndarray) -> torch.Tensor:
    if array.dtype.hasobject or not array.dtype.isnative:
        raise CanonicalError(f"state entry {name!r} is a numpy array of dtype {array.dtype}")
    try:
        return torch.from_numpy(np.ascontiguousarray(array))
    except TypeError as exc:
        raise CanonicalError(f"state entry {name!r} has unsupported numpy dtype {array.dtype}") from exc


def header_bytes(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The length prefix and padded JSON header for tensors already in canonical order."""
    return _header((name, tensor.dtype, list(tensor.shape)) for name, tensor in tensors.items())


def _header(entries: Iterable[tuple[str, torch.dtype, list[int]]]) -> bytes:
    """:func:`header_bytes` from each tensor's name, dtype and shape alone (``canonical_header.header_for``)."""
    return header_for((name, DTYPES[dtype], shape) for name, dtype, shape in entries)


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


def deserialize(data: bytes | bytearray, *, in_place: bool = False) -> dict[str, torch.Tensor]:
    """Parse canonical bytes, refusing anything that is not exactly canonical.

    The header is bounded (:data:`MAX_HEADER_BYTES`, nesting depth 3), parsed strictly (integers
    only, no ``NaN``/``Infinity``), and must be byte-identical to the canonical header of the tensors
    it describes; the data must be fully indexed. Whatever the bytes, the only exception raised is
    :class:`CanonicalError`.

    By default each tensor is copied out once from a view of ``data``, so parsing needs at most
    ``len(data)`` more memory. With ``in_place`` (``data`` must be a ``bytearray``, which the caller
    hands over) nothing is copied: the tensors are views of ``data``, each moved first to an address
    aligned for its dtype (:func:`_align_in_place`), so ``data`` no longer holds the file once parsed
    and stays allocated while any of the tensors lives. Both give writable tensors that alias nothing
    but their own bytes.
    """
    if in_place and not isinstance(data, bytearray):
        raise TypeError(f"in-place parsing needs a bytearray, not {type(data).__name__}")
    if len(data) < 8:
        raise CanonicalError("truncated: no header length")
    (length,) = struct.unpack_from("<Q", data)
    if length > MAX_HEADER_BYTES or 8 + length > len(data):
        raise CanonicalError(f"header length {length} is out of bounds for {len(data)} bytes")
    view = memoryview(data)
    raw_header = bytes(view[8 : 8 + length])
    if b"\\" in raw_header:
        raise CanonicalError("header holds escape sequences: not canonical")
    header = bounded_json(raw_header, max_depth=HEADER_DEPTH, what="header")
    if not isinstance(header, dict) or header.pop("__metadata__", None) != {"format": FORMAT}:
        raise CanonicalError(f"header does not declare format {FORMAT}")
    start, available = 8 + length, len(data) - 8 - length
    layout = {name: _entry_layout(name, entry, available) for name, entry in sorted(header.items())}
    if _header((name, dtype, shape) for name, (dtype, shape, _, _) in layout.items()) != bytes(view[:start]):
        raise CanonicalError("header is not in canonical form")
    indexed = sum(end - begin for _, _, begin, end in layout.values())
    if indexed != available:
        raise CanonicalError(f"data is {available} bytes, header indexes {indexed}")
    if in_place:
        placed = _align_in_place(data, start, layout)
        return {name: _view(view, dtype, shape, offset) for name, (dtype, shape, offset) in placed.items()}
    return {name: _tensor(view, start, *entry) for name, entry in layout.items()}


def bounded_json(raw: bytes, *, max_depth: int, what: str) -> object:
    """Strict JSON from ASCII ``raw``: nesting checked to ``max_depth`` before parsing, no ``NaN``/``Infinity``.

    Raises :class:`CanonicalError` (never ``RecursionError``) for anything else.
    """
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise CanonicalError(f"{what} is not ASCII JSON: {exc}") from exc
    if (depth := json_depth(text)) > max_depth:
        raise CanonicalError(f"{what} nests {depth} levels deep, more than {max_depth}")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except CanonicalError as exc:
        raise CanonicalError(f"{what} is not strict JSON: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # malformed JSON, an integer of over 4300 digits
        raise CanonicalError(f"{what} is not JSON: {exc}") from exc


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside strings in JSON ``text``, in linear time without recursion.

    Without backslashes a string runs from one quote to the next (vectorised); with escapes the
    text is walked character by character.
    """
    raw = np.frombuffer(text.encode("ascii", "replace"), dtype=np.uint8)
    if (raw == ord("\\")).any():
        return _walked_depth(text)
    quote = raw == ord('"')
    outside = (np.cumsum(quote) % 2 == 0) & ~quote
    opens = outside & ((raw == ord("[")) | (raw == ord("{")))
    closes = outside & ((raw == ord("]")) | (raw == ord("}")))
    return int(np.cumsum(opens.astype(np.int64) - closes).max(initial=0))


def _walked_depth(text: str) -> int:
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> None:
    raise CanonicalError(f"{name} is not a JSON number")


def _entry_layout(name: str, entry: object, available: int) -> tuple[torch.dtype, list[int], int, int]:
    """``(dtype, shape, begin, end)`` of a header entry, every number a non-negative int within the data."""
    if not isinstance(entry, dict) or entry.get("dtype") not in _CODES:
        raise CanonicalError(f"header entry {name!r} is malformed: {_short(entry)}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise CanonicalError(f"header entry {name!r} has a shape that is not a list of non-negative integers: {_short(shape)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise CanonicalError(f"header entry {name!r} has malformed data offsets: {_short(offsets)}")
    dtype, (begin, end) = _CODES[entry["dtype"]], offsets
    size = math.prod(shape) * dtype.itemsize  # python ints: no overflow
    if end < begin or end - begin != size:
        raise CanonicalError(f"header entry {name!r} has offsets that do not match its shape")
    if end > available:
        raise CanonicalError(f"tensor {name!r} runs past the end of the data")
    return dtype, shape, begin, end


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _tensor(view: memoryview, start: int, dtype: torch.dtype, shape: list[int], begin: int, end: int) -> torch.Tensor:
    try:
        if begin == end:
            return torch.empty(shape, dtype=dtype)
        raw = bytearray(view[start + begin : start + end])  # the one copy
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)
    except (RuntimeError, ValueError, OverflowError) as exc:  # e.g. more dimensions than torch allows
        raise CanonicalError(f"shape {_short(shape)} is not a tensor shape: {exc}") from exc


def _align_in_place(
    data: bytearray, start: int, layout: Mapping[str, tuple[torch.dtype, list[int], int, int]]
) -> dict[str, tuple[torch.dtype, list[int], int]]:
    """Move each tensor's bytes down within ``data`` to an address aligned for its dtype; ``(dtype,
    shape, offset in data)`` of each.

    Canonical data is packed back to back, so a float32 tensor after an odd-length JSON entry sits
    at an odd address, and typed access there is undefined behaviour. The tensors are repacked
    from the start of ``data`` in file order, each at the next aligned address: every one is
    padded by less than its item size (≤ 7 bytes), while the header it overwrites holds more than
    that per entry, so a tensor never moves up and never past the end of ``data``, and ``memmove``
    never overwrites bytes not yet moved.
    """
    base = ctypes.addressof(ctypes.c_char.from_buffer(data))  # the bytearray's own buffer (not resizable while viewed)
    placed, cursor = {}, 0
    for name, (dtype, shape, begin, end) in layout.items():
        source = start + begin
        offset = cursor + (-(base + cursor)) % dtype.itemsize
        if offset > source:  # excluded by the header's size (see above); never move bytes up
            raise RuntimeError(f"in-place parsing would move tensor {name!r} up, from {source} to {offset}")
        if offset != source and end > begin:
            ctypes.memmove(base + offset, base + source, end - begin)
        placed[name] = (dtype, shape, offset)
        cursor = offset + end - begin
    return placed


def _view(view: memoryview, dtype: torch.dtype, shape: list[int], offset: int) -> torch.Tensor:
    """A tensor over ``view``'s bytes at ``offset``. torch keeps a reference to ``view`` (not the
    bytearray's buffer export), whose own export keeps the bytearray from being resized under the tensor."""
    try:
        size = math.prod(shape) * dtype.itemsize
        if size == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(view, dtype=torch.uint8, count=size, offset=offset).view(dtype).reshape(shape)
    except (RuntimeError, ValueError, OverflowError) as exc:  # e.g. more dimensions than torch allows
        raise CanonicalError(f"shape {_short(shape)} is not a tensor shape: {exc}") from exc

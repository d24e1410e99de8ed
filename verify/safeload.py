"""Loading executor files safely: safetensors only, every byte accounted for, no NaN or Inf.

docs/protocol.md §12. Nothing here ever unpickles: pickles, ``torch.save`` zips and numpy files
are recognised by their first bytes and refused, whatever their name. A safetensors file is

    u64 little-endian N | N bytes of JSON header | data buffer

and is accepted only when N ≤ 16 MiB, the header is strict JSON (no duplicate keys, no NaN
literals) mapping names to ``{dtype, shape, data_offsets}`` plus an optional string→string
``__metadata__``, each shape has at most ``MAX_RANK`` dimensions of at most ``MAX_DIMENSION`` each
(a ``[0, 2**100]`` tensor holds no bytes, but whatever sizes it later overflows), each tensor's byte
length equals its shape × dtype size, and the tensors tile the
buffer exactly: contiguous, non-overlapping, no holes and no trailing bytes (no polyglot files).

Tensor data is streamed in fixed-size chunks through one reusable buffer, so checking a file needs
memory for one chunk, and loading it needs memory for the tensors alone. One file descriptor is
used from the size check to the last byte, so a file swapped on disk mid-check is never mixed in.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from trainmaster.jobs.canonical_header import ITEM_SIZES

from .errors import VerificationError

if TYPE_CHECKING:
    import numpy as np  # imported where tensor data is read: a verification with no safetensors file needs none

MAX_HEADER_BYTES = 16 * 1024 * 1024
CHUNK_BYTES = 8 * 1024 * 1024
SUFFIX = ".safetensors"

NUMPY_FLOATS = {"F64": "<f8", "F32": "<f4", "F16": "<f2"}
FLOATS = {*NUMPY_FLOATS, "BF16"}
"""The dtypes whose values can be NaN or ±Inf (integers have no invalid values; bools are checked apart)."""
ENTRY_KEYS = {"dtype", "shape", "data_offsets"}
MAX_RANK = 32
"""Dimensions of one tensor (torch allows 64; no model weight has more than a handful)."""
MAX_DIMENSION = 2**40
"""One dimension's size, and the elements of a tensor counting a 0-sized dimension as 1: a trillion,
far past any weight, far short of overflowing an int64 element count."""

Expected = Mapping[str, tuple[str, tuple[int, ...]]]
"""``name -> (safetensors dtype code, shape)``: the exact tensors a file must hold."""


class SafeLoadError(VerificationError):
    """A file that is refused; the reason names the file and what is wrong with it."""


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    """A checked safetensors header; ``tensors`` are in data order."""

    path: Path
    size: int
    header_length: int
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_length

    @property
    def largest_tensor_bytes(self) -> int:
        return max((t.nbytes for t in self.tensors), default=0)

    def expected(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """This file's tensors as an ``expected`` set (e.g. from W0, for checking returned weights)."""
        return {t.name: (t.dtype, t.shape) for t in self.tensors}


def inspect(path: Path, *, max_bytes: int | None = None) -> Header:
    """Read and check the header of ``path`` (not the tensor values)."""
    with _open(Path(path)) as handle:
        return _read_header(handle, Path(path), max_bytes)


def check_file(
    path: Path, *, expected: Expected | None = None, max_bytes: int | None = None, values: bool = True
) -> Header:
    """Check everything — header, expected tensors, finiteness of every value — keeping no tensor.

    ``values=False`` checks the header and the expected tensors only, reading no tensor data: for
    files nobody here loads unless they are opened and parsed strictly elsewhere (a checkpoint
    segment: the replay audit opens the challenged ones, verify/openings.py).
    """
    path = Path(path)
    with _open(path) as handle:
        header = _read_header(handle, path, max_bytes)
        _check_expected(header, expected)
        checked = [entry for entry in header.tensors if values and (entry.dtype == "BOOL" or entry.dtype in FLOATS)]
        buffer = bytearray(min(CHUNK_BYTES, max((e.nbytes for e in checked), default=0) + 7))
        for entry in checked:
            for chunk in _chunks(handle, header, entry, buffer):
                _check_values(path, entry, chunk)
    return header


def load_checked(path: Path, *, expected: Expected | None = None, max_bytes: int | None = None) -> dict:
    """Check ``path`` like :func:`check_file` and return its tensors (``name -> torch.Tensor``)."""
    import torch

    path = Path(path)
    tensors = {}
    with _open(path) as handle:
        header = _read_header(handle, path, max_bytes)
        _check_expected(header, expected)
        for entry in header.tensors:
            raw = torch.empty(entry.nbytes, dtype=torch.uint8)
            handle.seek(header.data_start + entry.begin)
            _read_exactly(handle, memoryview(raw.numpy()), path)
            values = raw.numpy()
            step = CHUNK_BYTES - CHUNK_BYTES % ITEM_SIZES[entry.dtype]
            for start in range(0, entry.nbytes, step):
                _check_values(path, entry, values[start : start + step])
            tensors[entry.name] = raw.view(_torch_dtype(entry.dtype)).reshape(entry.shape)
    return tensors


def check_declared_size(name: str, declared: int, max_bytes: int) -> None:
    """Refuse a file whose size, as the executor declares it before the transfer, is over the cap."""
    if declared > max_bytes:
        raise SafeLoadError(f"{name}: declared size {declared} bytes is over the cap of {max_bytes} bytes")


def canonical_header_matches(path: Path) -> bool:
    """Whether ``path``'s header is byte-identical to the canonical header (``jobs.canonical``) of its tensors."""
    from trainmaster.jobs.canonical_header import header_for

    header = inspect(path)
    entries = [(t.name, t.dtype, t.shape) for t in sorted(header.tensors, key=lambda t: t.name)]
    with _open(Path(path)) as handle:
        return handle.read(header.data_start) == header_for(entries)


# isolation (docs/protocol.md §12 rule 5)

ISOLATED_MEMORY_BYTES = 1024 * 1024 * 1024  # beyond what the child has mapped after its imports
ISOLATED_CPU_SECONDS = 600


@dataclass(frozen=True)
class FileCheck:
    """What an isolated check found for one file: ``reason`` is None when it passed."""

    path: str
    reason: str | None
    size: int = 0
    tensors: int = 0


def check_files_isolated(
    files: Mapping[Path, Expected | None],
    *,
    max_bytes: int | None = None,
    headers_only: Collection[Path] = (),
    memory_bytes: int = ISOLATED_MEMORY_BYTES,
    cpu_seconds: int = ISOLATED_CPU_SECONDS,
) -> list[FileCheck]:
    """:func:`check_file` on each file, in a child process under memory and CPU-time limits
    (``headers_only``: as for :func:`check_files`).

    The child imports what it needs, then limits itself to ``memory_bytes`` more address space and
    ``cpu_seconds`` more CPU time, so the limits bound the checking alone. The checks are bounded by
    design; the limits are defence in depth against a file that finds a way around them. A file
    that runs the child out of memory gets that as its reason; a child killed by the CPU limit
    raises :class:`SafeLoadError`; one that fails otherwise ``VerificationError(kind="cannot_verify")``.
    The child runs in an empty directory of its own: ``-m`` puts the working directory first on its
    ``sys.path``, and the caller's may be the very folder being judged (`trainmaster verify .`), whose
    ``numpy.py`` must never be imported.
    """
    import subprocess
    import sys
    import tempfile

    given = {str(Path(p).absolute()): str(p) for p in files}  # the child resolves nothing against our cwd
    request = {
        "max_bytes": max_bytes,
        "memory_bytes": memory_bytes,
        "cpu_seconds": cpu_seconds,
        "files": [{"path": str(Path(p).absolute()), "expected": _expected_json(e)} for p, e in files.items()],
        "headers_only": [str(Path(p).absolute()) for p in headers_only],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="trainmaster-safeload-") as empty:
        done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(request), capture_output=True,
                              text=True, env=env, cwd=empty, check=False)
    if done.returncode < 0:
        names = ", ".join(Path(p).name for p in files)
        raise SafeLoadError(f"checking {names} was stopped by the loader's CPU limit (a hostile file)")
    if done.returncode != 0:
        raise VerificationError(f"the isolated safety check failed: {done.stderr.strip()[-500:]}", kind="cannot_verify")
    return [FileCheck(**{**item, "path": given[item["path"]]}) for item in json.loads(done.stdout)]


def _expected_json(expected: Expected | None) -> dict | None:
    return None if expected is None else {name: [dtype, list(shape)] for name, (dtype, shape) in expected.items()}


def check_files(
    files: Mapping[Path, Expected | None], *, max_bytes: int | None = None, headers_only: Collection[Path] = ()
) -> list[FileCheck]:
    """:func:`check_file` on each file, in this process; what the isolated child runs.

    ``headers_only``: the files among ``files`` whose tensor data is not read (``values=False``).
    """
    results = []
    unread = {str(p) for p in headers_only}
    for path, expected in files.items():
        try:
            header = check_file(Path(path), expected=expected, max_bytes=max_bytes, values=str(path) not in unread)
        except SafeLoadError as exc:
            results.append(FileCheck(str(path), exc.reason))
        except MemoryError:
            results.append(FileCheck(str(path), f"{Path(path).name}: checking it ran out of the loader's memory limit (a hostile file)"))
        else:
            results.append(FileCheck(str(path), None, header.size, len(header.tensors)))
    return results


def _serve_isolated() -> None:
    """The child side of :func:`check_files_isolated`: a JSON request on stdin, JSON results on stdout."""
    import dataclasses
    import sys

    request = json.load(sys.stdin)
    limit_self(request["memory_bytes"], request["cpu_seconds"])
    files = {
        Path(item["path"]): None if item["expected"] is None else {n: (d, tuple(s)) for n, (d, s) in item["expected"].items()}
        for item in request["files"]
    }
    checked = check_files(files, max_bytes=request["max_bytes"], headers_only=request["headers_only"])
    json.dump([dataclasses.asdict(r) for r in checked], sys.stdout)


def limit_self(memory_bytes: int, cpu_seconds: int) -> None:
    """Allow this process ``memory_bytes`` more address space and ``cpu_seconds`` more CPU time. numpy, which the
    checks read tensor data and .npy headers with, is loaded first: a shared library mapped after the limit may not
    fit under it."""
    import importlib
    import resource

    importlib.import_module("numpy")

    with open("/proc/self/statm") as handle:
        mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes,) * 2)
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime) + 1 + cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))


# reading


def _open(path: Path) -> BinaryIO:
    """Open a regular ``.safetensors`` file, without following a final symlink or blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SafeLoadError(f"{path.name}: cannot open: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SafeLoadError(f"{path.name}: not a regular file")
    handle = os.fdopen(fd, "rb")
    if path.suffix != SUFFIX:
        kind = pickle_format(handle.read(8))
        handle.close()
        raise SafeLoadError(f"{path.name}: only {SUFFIX} files are loaded" + (f" (this one is {kind})" if kind else ""))
    return handle


def pickle_protocol(prefix: bytes) -> int | None:
    """The protocol of the pickle ``prefix`` starts with: 2–5 begin with a PROTO opcode; 0 and 1 have
    no magic bytes and are not recognised."""
    if len(prefix) >= 2 and prefix[0] == 0x80 and 2 <= prefix[1] <= 5:
        return prefix[1]
    return None


def pickle_format(prefix: bytes) -> str | None:
    """The name of a pickle-based format ``prefix`` starts with, if any (verify/output_kinds.py looks
    inside zip archives; here any zip counts, since only safetensors are ever loaded)."""
    if prefix.startswith(b"PK\x03\x04"):
        return "a zip archive, as torch.save and np.savez write, holding pickles"
    if (protocol := pickle_protocol(prefix)) is not None:
        return f"a pickle (protocol {protocol})"
    if prefix.startswith(b"\x93NUMPY"):
        return "a numpy .npy file, which may hold pickles"
    return None


def _read_header(handle: BinaryIO, path: Path, max_bytes: int | None) -> Header:
    size = os.fstat(handle.fileno()).st_size
    if max_bytes is not None and size > max_bytes:
        raise SafeLoadError(f"{path.name}: {size} bytes is over the cap of {max_bytes} bytes")
    prefix = handle.read(8)
    if kind := pickle_format(prefix):
        raise SafeLoadError(f"{path.name}: is {kind}; pickled data is never loaded")
    if len(prefix) < 8:
        raise SafeLoadError(f"{path.name}: only {len(prefix)} bytes, too short for a safetensors header length")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES:
        raise SafeLoadError(f"{path.name}: header length {length} is over the limit of {MAX_HEADER_BYTES} bytes")
    if 8 + length > size:
        raise SafeLoadError(f"{path.name}: header length {length} runs past the end of the {size}-byte file")
    raw = handle.read(length)
    parsed = _parse_json(path, raw)
    metadata = _metadata(path, parsed.pop("__metadata__", {}))
    entries = sorted((_entry(path, name, value) for name, value in parsed.items()), key=lambda e: (e.begin, e.end))
    _check_tiling(path, entries, size - 8 - length)
    return Header(path=path, size=size, header_length=length, tensors=tuple(entries), metadata=metadata)


def _parse_json(path: Path, raw: bytes) -> dict:
    if not raw.startswith(b"{"):
        raise SafeLoadError(f"{path.name}: the header does not start with '{{'")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise SafeLoadError(f"{path.name}: the header is not UTF-8: {exc}") from exc
    except ValueError as exc:  # JSONDecodeError, duplicate keys, NaN literals, over-long integers
        raise SafeLoadError(f"{path.name}: the header is not strict JSON: {exc}") from exc
    except RecursionError as exc:
        raise SafeLoadError(f"{path.name}: the header nests too deeply") from exc


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {_short(key)}")
        result[key] = value
    return result


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _metadata(path: Path, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SafeLoadError(f"{path.name}: __metadata__ must map strings to strings")
    return value


def _entry(path: Path, name: str, value: object) -> TensorEntry:
    """One header entry, checked (the reason names the file and the tensor; built only on failure:
    a checkpoint directory's headers hold tens of thousands of entries)."""

    def refuse(problem: str) -> SafeLoadError:
        return SafeLoadError(f"{path.name}: tensor {_short(name)}: {problem}")

    if type(value) is not dict or value.keys() != ENTRY_KEYS:
        raise refuse("entry must have exactly the keys dtype, shape, data_offsets")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if type(dtype) is not str or dtype not in ITEM_SIZES:
        raise refuse(f"unsupported dtype {_short(dtype)} (allowed: {', '.join(ITEM_SIZES)})")
    if type(shape) is not list or not _are_counts(shape):
        raise refuse(f"shape {_short(shape)} is not a list of non-negative integers")
    if len(shape) > MAX_RANK or not _bounded_shape(shape):
        raise refuse(f"shape {_short(shape)} is over the limits of {MAX_RANK} dimensions and {MAX_DIMENSION} "
                     "elements (each dimension, and all of them, a 0-sized one counted as 1)")
    if type(offsets) is not list or len(offsets) != 2 or not _are_counts(offsets):
        raise refuse(f"data_offsets {_short(offsets)} is not a pair of non-negative integers")
    begin, end = offsets
    if end < begin:
        raise refuse(f"data_offsets {offsets} end before they begin")
    expected = math.prod(shape) * ITEM_SIZES[dtype]
    if end - begin != expected:
        raise refuse(f"{end - begin} bytes of data, but shape {shape} of {dtype} needs {expected}")
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _are_counts(values: list) -> bool:
    """Every value a non-negative int (not a bool, not a float); a plain loop, the fastest for a
    shape's few values (a checkpoint directory's headers hold tens of thousands of entries)."""
    for value in values:
        if type(value) is not int or value < 0:
            return False
    return True


def _bounded_shape(shape: list[int]) -> bool:
    """Each dimension and the product of all (0 counted as 1) at most MAX_DIMENSION."""
    elements = 1
    for size in shape:
        elements *= size or 1
        if elements > MAX_DIMENSION:
            return False
    return True


def _short(value: object) -> str:
    """A header value as a reason shows it: at most 80 characters of it."""
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _check_tiling(path: Path, entries: list[TensorEntry], buffer_bytes: int) -> None:
    """The tensors, in offset order, must cover ``[0, buffer_bytes)`` exactly once."""
    cursor = 0
    for entry in entries:
        if entry.begin < cursor:
            raise SafeLoadError(f"{path.name}: tensor {_short(entry.name)} overlaps the one before it (offset {entry.begin} < {cursor})")
        if entry.begin > cursor:
            raise SafeLoadError(f"{path.name}: a hole of {entry.begin - cursor} unindexed bytes before tensor {_short(entry.name)}")
        cursor = entry.end
    if cursor > buffer_bytes:
        raise SafeLoadError(f"{path.name}: tensors index {cursor} bytes of data, the file holds only {buffer_bytes}")
    if cursor < buffer_bytes:
        raise SafeLoadError(f"{path.name}: {buffer_bytes - cursor} trailing bytes after the last tensor")


def _check_expected(header: Header, expected: Expected | None) -> None:
    if expected is None:
        return
    found = header.expected()
    want = {name: (dtype, tuple(shape)) for name, (dtype, shape) in expected.items()}
    missing = sorted(want.keys() - found.keys())
    extra = sorted(found.keys() - want.keys())
    wrong = sorted(n for n in want.keys() & found.keys() if want[n] != found[n])
    problems = []
    if missing:
        problems.append(f"missing tensors {_few(missing)}")
    if extra:
        problems.append(f"unexpected tensors {_few(extra)}")
    for name in wrong[:5]:
        problems.append(f"tensor {_short(name)} is {found[name][0]}{list(found[name][1])}, expected {want[name][0]}{list(want[name][1])}")
    if len(wrong) > 5:
        problems.append(f"{len(wrong) - 5} more tensors with the wrong dtype or shape")
    if problems:
        raise SafeLoadError(f"{header.path.name}: " + "; ".join(problems))


def _few(names: list[str]) -> str:
    shown = ", ".join(_short(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _chunks(handle: BinaryIO, header: Header, entry: TensorEntry, buffer: bytearray) -> Iterator[np.ndarray]:
    """``entry``'s bytes as uint8 arrays over ``buffer``, each a whole number of elements."""
    import numpy as np

    handle.seek(header.data_start + entry.begin)
    step = len(buffer) - len(buffer) % ITEM_SIZES[entry.dtype]
    remaining = entry.nbytes
    while remaining:
        size = min(step, remaining)
        view = memoryview(buffer)[:size]
        _read_exactly(handle, view, header.path)
        yield np.frombuffer(view, dtype=np.uint8)
        remaining -= size


def _read_exactly(handle: BinaryIO, view: memoryview, path: Path) -> None:
    done = 0
    while done < len(view):
        got = handle.readinto(view[done:])
        if not got:
            raise SafeLoadError(f"{path.name}: the file ended early (it changed while being read)")
        done += got


def _check_values(path: Path, entry: TensorEntry, raw: np.ndarray) -> None:
    """Refuse NaN/Inf in float tensors and bytes other than 0 and 1 in bool tensors (``raw``: the bytes as uint8).

    numpy, not torch: ``np.isfinite`` runs at memory speed where ``torch.isfinite`` was ~10× slower on CPU.
    bf16, which numpy lacks, is checked on its bits: exponent all ones is ±Inf (mantissa 0) or NaN.
    """
    import numpy as np

    if entry.dtype in NUMPY_FLOATS:
        values = raw.view(NUMPY_FLOATS[entry.dtype])
        if not np.isfinite(values).all():
            _non_finite(path, entry, bool(np.isnan(values).any()), bool(np.isinf(values).any()))
    elif entry.dtype == "BF16":
        bits = raw.view("<u2")
        special = (bits & 0x7F80) == 0x7F80
        if special.any():
            mantissa = (bits & 0x007F) != 0
            _non_finite(path, entry, bool((special & mantissa).any()), bool((special & ~mantissa).any()))
    elif entry.dtype == "BOOL" and bool((raw > 1).any()):
        raise SafeLoadError(f"{path.name}: tensor {_short(entry.name)} holds bool bytes other than 0 and 1")


def _non_finite(path: Path, entry: TensorEntry, nan: bool, inf: bool) -> None:
    kinds = " and ".join(label for label, found in (("NaN", nan), ("±Inf", inf)) if found)
    raise SafeLoadError(f"{path.name}: tensor {_short(entry.name)} holds {kinds}")


def _torch_dtype(code: str):
    import torch

    return {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
        "U8": torch.uint8, "BOOL": torch.bool,
    }[code]


if __name__ == "__main__":
    _serve_isolated()

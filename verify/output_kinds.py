"""What each returned file is, judged by its content and never by loading it.

The judge is positive: a file is data only when its content is identified as a safe format. Five kinds
(docs/verification.md, "Safety"):

- ``safetensors``: a ``.safetensors`` file, checked in full by verify/safeload.py;
- ``pickle``: a file that can run code when loaded: a pickle of any protocol (2–5 by their first
  bytes; 0 and 1, which have no magic bytes and may look like text, by parsing their opcodes:
  verify/pickle_stream.py), also compressed (zlib/gzip/bz2/xz, as joblib writes it), a zip or tar
  archive holding one (a ``torch.save`` file — ``<name>/data.pkl`` — whatever it is called, the
  legacy ``torch.save`` tar, a Stable-Baselines3 model — a ``data`` member with base64 cloudpickle
  in ``:serialized:`` fields, ``policy.pth`` — or an ``.npz`` with object arrays), a numpy file of
  Python objects, or a file whose suffix names a pickle format (``.pt``, ``.pth``, ``.pkl``, …);
- ``unchecked``: anything not identified: unrecognised binary data, a model format trainmaster does
  not inspect (``.onnx``, ``.h5``, ``.keras``, ``.gguf``, …), a zstd stream, an archive inside an
  archive, an archive member not identified, or an archive too large, too damaged or holding links;
- ``data``: content identified as safe (verify/safe_formats.py): UTF-8 text that is no pickle stream
  (logs, JSON, CSV, YAML), PNG/JPEG/GIF/WebP/BMP images, numeric numpy arrays, a compressed one of
  those, and zip or tar archives whose members all are;
- ``hostile``: a zip archive whose entries overlap (a zip bomb): refused whatever the trust.

On trusted compute ``pickle`` and ``unchecked`` files are kept OPAQUE (recorded and hashed, never
loaded by the broker, listed in the verdict); from untrusted compute they are refused.

Reading is bounded: the first 64 KiB of a regular file (1 MiB of a bz2 stream; a link or special
file is never opened) and 64 KiB of what a compressed one decompresses to, a zip's central directory
(not read when its end record announces more than ``MAX_MEMBERS`` members or a directory over
``MAX_DIRECTORY_BYTES``), a tar's headers one by one (verify/tar_bounds.py), and, unless a zip's
entries overlap or declare too much (verify/zip_bounds.py), the first 10 KB of each member and a
JSON member searched in chunks, all archives of a verification together within one budget
(``zip_bounds.MAX_INSPECTED_BYTES``). The safety check looks into archives in a child process
under CPU and memory limits (verify/archive_child.py).
"""

from __future__ import annotations

import bz2
import io
import lzma
import os
import re
import struct
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from trainmaster.jobs.files import open_regular

from .pickle_stream import pickle_stream
from .safe_formats import image_kind, text_kind
from .tar_bounds import tar_verdict
from .zip_bounds import Budget, declared_too_big, overlapping

SAFETENSORS, PICKLE, UNCHECKED, DATA, HOSTILE = "safetensors", "pickle", "unchecked", "data", "hostile"
ARCHIVE = "archive"
"""Not a verdict: a zip or tar archive left for verify/archive_child.py (``classify(…, archives=False)``)."""

PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill", ".sav", ".cloudpickle"})
UNCHECKED_SUFFIXES = frozenset({
    ".bin", ".npy", ".npz", ".h5", ".hdf5", ".keras", ".onnx", ".pb", ".gguf", ".msgpack", ".tflite", ".mar",
})

NUMPY_SUFFIXES = frozenset({".npy", ".npz"})

MAX_MEMBERS = 100_000
MAX_DIRECTORY_BYTES = 64 * 2**20
JSON_CHUNK_BYTES = 2**20
NPY_HEADER_BYTES = 10_000 + 12
"""What numpy reads of a .npy header at most (its 10,000-byte header limit, plus magic and length)."""
PREFIX_BYTES = 16
MEMBER_HEAD_BYTES = NPY_HEADER_BYTES
"""What is read of each archive member to judge it (a whole numpy header fits)."""
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
HEAD_BYTES = 64 * 1024
BZ2_HEAD_BYTES = 1024 * 1024
SB3_SERIALIZED = b'":serialized:"'
NUMPY_ARRAY, BUDGET_SPENT = "numpy array", "budget spent"

CONVERT = (
    "save weights as safetensors instead: safetensors.torch.save_file(model.state_dict(), \"model.safetensors\") "
    "(Stable-Baselines3: model.policy.state_dict()), or leave the file out with the spec's outputs.exclude"
)


@dataclass(frozen=True)
class FileKind:
    kind: str
    what: str
    """What the file was found to be, as a phrase: "a torch.save archive (pickles inside: model/data.pkl)"."""


def classify(path: Path, budget: Budget | None = None, *, archives: bool = True) -> FileKind:
    """The kind of the regular file ``path``, from its content first and its name second; ``budget``:
    what looking into archives may still spend (one per verification; a fresh one by default).
    ``archives=False``: a zip or tar archive is not looked into here but returned as ARCHIVE, for
    verify/archive_child.py to classify in a child process under CPU and memory limits.

    The judge is positive: a file is DATA only when its content is identified as a safe format."""
    path = Path(path)
    budget = budget or Budget()
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return FileKind(SAFETENSORS, "a safetensors file")
    with _open(path) as handle:
        head = handle.read(HEAD_BYTES)
        if head.startswith(b"BZh"):
            head += handle.read(BZ2_HEAD_BYTES - len(head))  # bz2 outputs nothing before its first block is whole
        complete = not handle.read(1)
    found = _by_content(path, head, complete, budget, archives)
    if found.kind not in (DATA, UNCHECKED):
        return found
    if suffix in PICKLE_SUFFIXES:
        return FileKind(PICKLE, f"a {suffix} file (a pickle-based format by its name)")
    if found.kind == DATA and suffix in NUMPY_SUFFIXES and found.what.startswith("a numpy"):
        return found  # numeric arrays, read with allow_pickle=False
    if found.kind == DATA and suffix not in UNCHECKED_SUFFIXES:
        return found
    if suffix in UNCHECKED_SUFFIXES:
        return FileKind(UNCHECKED, f"a {suffix} file (a model format trainmaster does not check)")
    return found


def _by_content(path: Path, head: bytes, complete: bool, budget: Budget, archives: bool) -> FileKind:
    """The kind ``head`` (a file's first bytes; ``complete``: all of them) shows, archives looked into
    unless ``archives`` is False; UNCHECKED "unrecognised binary data" when nothing is identified."""
    inner = _decompressed(head)
    if (found := _by_prefix(head, inner[0])) is not None:
        return found
    if _magic_archive(head, inner[0]) and not archives:
        return FileKind(ARCHIVE, "an archive, looked into in a child process")
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(path, budget)
    if _is_tar(head) or _is_tar(inner[0]):
        return _tar_kind(path, budget, compressed=not _is_tar(head))
    if head.startswith(b"\x93NUMPY"):
        with _open(path) as handle:
            return _npy_kind(handle)
    return _plain_kind(head, complete, inner)


def _plain_kind(head: bytes, complete: bool, inner: tuple[bytes, bool] | None = None) -> FileKind:
    """The kind of bytes that are no archive: a pickle stream of any protocol, an image, a compressed
    one of those (``inner``: what ``head`` decompresses to, and whether it ended; None: not looked
    for), text, or unrecognised data."""
    if (stream := pickle_stream(head, complete=complete)) is not None:
        return FileKind(PICKLE, stream)
    if (what := image_kind(head)) is not None:
        return FileKind(DATA, what)
    if inner is not None and inner[0]:
        found = _plain_kind(*inner)
        return replace(found, what=f"a compressed {found.what.removeprefix('a ')}")
    if (what := text_kind(head, complete=complete)) is not None:
        return FileKind(DATA, what)
    if head.startswith(ZSTD_MAGIC):
        return FileKind(UNCHECKED, "a zstd stream (not looked into)")
    return FileKind(UNCHECKED, "unrecognised binary data")


def _open(path: Path):
    """``path`` opened for reading when it is a regular file (HostileFile otherwise: never opened)."""
    fd, _ = open_regular(path)
    return os.fdopen(fd, "rb")


def _by_prefix(head: bytes, inner: bytes) -> FileKind | None:
    """The kind the first bytes of a file show by their magic (``head``: up to HEAD_BYTES of them;
    ``inner``: what they decompress to), if any."""
    from .safeload import pickle_protocol  # numpy: not imported by `submit --dry-run`, which scans sources only

    if (protocol := pickle_protocol(head)) is not None:
        return FileKind(PICKLE, f"a pickle (protocol {protocol})")
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return FileKind(UNCHECKED, "an HDF5 file (Keras models in it may hold code)")
    if pickle_protocol(inner) is not None:
        return FileKind(PICKLE, f"a compressed pickle (protocol {inner[1]}, as joblib writes)")
    return None


def _magic_archive(head: bytes, inner: bytes) -> bool:
    """Whether ``head`` (decompressing to ``inner``) starts a zip or a tar, plain or compressed:
    archives, looked into apart."""
    return head.startswith(b"PK\x03\x04") or _is_tar(head) or _is_tar(inner)


def _is_tar(head: bytes) -> bool:
    return head[257:262] == b"ustar"


def _decompressed(prefix: bytes) -> tuple[bytes, bool]:
    """The first bytes (up to HEAD_BYTES) a gzip, zlib, bz2 or xz stream starting with ``prefix``
    decompresses to, and whether the stream ended there; ``b""`` when it is no such stream (a dynamic
    Huffman table alone can take a few hundred bytes, hence HEAD_BYTES of input)."""
    if prefix.startswith(b"\x1f\x8b"):
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif len(prefix) >= 2 and prefix[0] == 0x78 and (prefix[0] << 8 | prefix[1]) % 31 == 0:
        stream = zlib.decompressobj()
    elif prefix.startswith(b"BZh"):
        stream = bz2.BZ2Decompressor()
    elif prefix.startswith(b"\xfd7zXZ\x00"):
        stream = lzma.LZMADecompressor()
    else:
        return b"", False
    try:
        inner = stream.decompress(prefix, HEAD_BYTES)
    except (zlib.error, OSError, EOFError, lzma.LZMAError, ValueError):
        return b"", False
    return inner, stream.eof


def _npy_kind(handle) -> FileKind:
    """A .npy file (or member) by its header: object arrays are pickled, numeric ones are data."""
    import numpy as np

    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        version = np.lib.format.read_magic(handle)
        if version not in readers:
            return FileKind(UNCHECKED, f"a numpy file of format version {version}, not inspected")
        shape, _, dtype = readers[version](handle)  # a literal_eval of a header of at most 10,000 bytes
    except (ValueError, SyntaxError, EOFError, TypeError, OSError) as exc:
        return FileKind(UNCHECKED, f"a numpy file with a header that cannot be read ({exc})")
    if dtype.hasobject:
        return FileKind(PICKLE, "a numpy array of Python objects (stored as a pickle)")
    return FileKind(DATA, f"a numpy array ({dtype}, {list(shape)})")


# zip archives


def _zip_kind(path: Path, budget: Budget) -> FileKind:
    with _open(path) as handle:
        if too_big := _not_listed(handle, budget):
            return FileKind(UNCHECKED, f"a zip archive not inspected: {too_big}")
        try:
            archive = zipfile.ZipFile(handle)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            return FileKind(UNCHECKED, f"a damaged zip archive ({exc})")
        with archive:
            if shared := overlapping(archive, handle):
                return FileKind(HOSTILE, f"a zip bomb: {shared} of its {len(archive.infolist())} entries overlap "
                                         "the bytes of another (no zip writer makes such an archive)")
            if too_big := declared_too_big(archive):
                return FileKind(UNCHECKED, f"a zip archive not inspected: {too_big}")
            return _members_kind(archive, budget)


def _members_kind(archive: zipfile.ZipFile, budget: Budget) -> FileKind:
    pickles, unreadable, arrays, serialized = [], [], 0, False
    members = [info for info in archive.infolist() if not info.is_dir()]
    for at, info in enumerate(members):
        if PurePosixPath(info.filename).suffix.lower() in PICKLE_SUFFIXES:
            pickles.append(info.filename)
            continue
        if not budget.take(PREFIX_BYTES):
            unreadable.append(f"{len(members) - at} members past the inspection budget")
            break
        try:
            with archive.open(info) as member:
                found = _member_kind(member, budget)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, RuntimeError, zlib.error,
                lzma.LZMAError) as exc:  # encrypted, an unknown compression, a corrupt stream
            unreadable.append(f"{info.filename} ({type(exc).__name__})")
            continue
        if found in (PICKLE, SB3_SERIALIZED):
            pickles.append(info.filename)
            serialized = serialized or found == SB3_SERIALIZED
        elif found == UNCHECKED:
            unreadable.append(info.filename)
        elif found == BUDGET_SPENT:
            unreadable.append(f"{info.filename} (past the inspection budget)")
        arrays += found == NUMPY_ARRAY
    if pickles:
        return FileKind(PICKLE, _archive_phrase(pickles, serialized))
    if unreadable:
        return FileKind(UNCHECKED, f"a zip archive with members not inspected: {_few(unreadable)}")
    if members and arrays == len(members):
        return FileKind(DATA, f"a numpy .npz archive of {arrays} numeric arrays")
    return FileKind(DATA, f"a zip archive of {len(members)} files, none pickle-capable")


def _member_kind(member, budget: Budget) -> str | bytes | None:
    """What one archive member (an open stream) is, by its first bytes: PICKLE (of any protocol),
    SB3_SERIALIZED (a JSON member with cloudpickle fields), NUMPY_ARRAY (numeric), UNCHECKED (an
    archive or compressed stream inside, an unreadable numpy header, unrecognised bytes),
    BUDGET_SPENT, or None (identified data: text, an image)."""
    from .safeload import pickle_protocol

    granted = budget.take(MEMBER_HEAD_BYTES)
    head = member.read(granted)
    if granted < MEMBER_HEAD_BYTES and len(head) == granted and member.read(1):
        return BUDGET_SPENT
    complete = len(head) < MEMBER_HEAD_BYTES
    if head.startswith(b"\x93NUMPY"):
        kind = _npy_kind(io.BytesIO(head)).kind
        return NUMPY_ARRAY if kind == DATA else kind
    if pickle_protocol(head) is not None:
        return PICKLE
    if _magic_archive(head, b"") or _decompressed(head)[0]:
        return UNCHECKED  # an archive or compressed stream inside the archive is not opened
    if pickle_stream(head, complete=complete) is not None:
        return PICKLE
    if image_kind(head) is not None:
        return None
    if text_kind(head, complete=complete) is None:
        return UNCHECKED
    if head.lstrip()[:1] == b"{":
        found = _holds_serialized(head, member, budget)
        return BUDGET_SPENT if found is None else SB3_SERIALIZED if found else None
    return None


def _holds_serialized(prefix: bytes, member, budget: Budget) -> bool | None:
    """Whether a JSON member carries Stable-Baselines3's base64 cloudpickle fields, searched chunk by
    chunk (a chunk's memory); None when the inspection budget ran out before the member's end."""
    carry = prefix
    while chunk := member.read(budget.take(JSON_CHUNK_BYTES)):
        window = carry + chunk
        if SB3_SERIALIZED in window:
            return True
        carry = window[-len(SB3_SERIALIZED):]
    if SB3_SERIALIZED in carry:
        return True
    return None if member.read(1) else False


# tar archives


def _tar_kind(path: Path, budget: Budget, *, compressed: bool) -> FileKind:
    """A tar archive (plain or gzip/bz2/xz-compressed) looked into within verify/tar_bounds.py's bounds."""
    with _open(path) as handle:
        try:
            with tarfile.open(fileobj=handle, mode="r:*") as archive:
                kind, what = tar_verdict(archive, budget, compressed=compressed, max_members=MAX_MEMBERS,
                                         member_kind=_tar_member_kind)
        except (tarfile.TarError, OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
            return FileKind(UNCHECKED, f"a damaged tar archive ({type(exc).__name__})")
    return FileKind(kind, what)


def _tar_member_kind(archive: tarfile.TarFile, info: tarfile.TarInfo, budget: Budget) -> str | None:
    """One tar member's kind for verify/tar_bounds.py: PICKLE, UNCHECKED, BUDGET_SPENT or None (data)."""
    if PurePosixPath(info.name).suffix.lower() in PICKLE_SUFFIXES:
        return PICKLE
    member = archive.extractfile(info)
    if member is None:
        return UNCHECKED
    with member:
        found = _member_kind(member, budget)
    return {SB3_SERIALIZED: PICKLE, NUMPY_ARRAY: None}.get(found, found)


def _archive_phrase(pickles: list[str], serialized: bool) -> str:
    if serialized:
        return f"a Stable-Baselines3 model archive (cloudpickled fields in its data member; pickles inside: {_few(pickles)})"
    if any(PurePosixPath(p).name == "data.pkl" and "/" in p for p in pickles):  # torch.save: <name>/data.pkl
        return f"a torch.save archive (pickles inside: {_few(pickles)})"
    return f"a zip archive holding pickles ({_few(pickles)})"


def _few(names: list[str]) -> str:
    """Up to three member names (each cut to 80 characters: a zip's names can be 64 KiB) and a count."""
    shown = [name if len(name) <= 80 else name[:77] + "..." for name in names[:3]]
    return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _not_listed(handle, budget: Budget) -> str | None:
    """Why the zip's central directory is not read, from its end record (too big, or past the
    verification's budget); None when it may be (its cost then spent)."""
    handle.seek(0, 2)
    size = handle.tell()
    tail_start = max(0, size - (22 + 65535))
    handle.seek(tail_start)
    tail = handle.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return None  # no end record: zipfile says the archive is damaged
    entries, directory = struct.unpack("<HI", tail[at + 10 : at + 16])
    if (entries == 0xFFFF or directory == 0xFFFFFFFF) and at >= 20 and tail[at - 20 : at - 16] == b"PK\x06\x07":
        (offset,) = struct.unpack("<Q", tail[at - 12 : at - 4])
        handle.seek(offset)
        record = handle.read(56)
        if len(record) == 56 and record[:4] == b"PK\x06\x06":
            entries, directory = struct.unpack("<QQ", record[32:48])
    if entries > MAX_MEMBERS:
        return f"{entries} members, over the limit of {MAX_MEMBERS}"
    if directory > MAX_DIRECTORY_BYTES:
        return f"a {directory}-byte directory, over the limit of {MAX_DIRECTORY_BYTES}"
    if not budget.list(entries, directory):
        return "this verification's budget for looking into archives is spent"
    return None


# the script scan for `submit --dry-run`

SAVE_PATTERNS = (
    (re.compile(r"\btorch\.save\s*\("), "torch.save( writes a pickle-based file"),
    (re.compile(r"\b(?:c?pickle|cloudpickle|dill|joblib)\.dumps?\s*\("), "a pickle dump"),
    (re.compile(r"\bsave_checkpoint\s*\("), "save_checkpoint( (Lightning writes a pickle-based .ckpt)"),
    (re.compile(r"\b(?:Trainer|TrainingArguments)\s*\("), "a Trainer( (Hugging Face's writes training_args.bin, "
     "optimizer.pt and rng_state.pth; Lightning's writes .ckpt checkpoints)"),
    (re.compile(r"(?<!torch)(?<!np)(?<!numpy)\.save\s*\("), "a .save( call (e.g. Stable-Baselines3's model.save "
     "writes a zip of cloudpickle)"),
)
MAX_SCANNED_FILES = 200
MAX_SCANNED_BYTES = 2 * 2**20


def scan_sources(files: dict[str, str]) -> list[str]:
    """Lines of ``{relative path: text}`` that may write pickle-capable outputs: ``"train.py:42: torch.save( …"``.

    A text scan: it cannot know where the file goes or what a call writes, so it only says "may".
    """
    found = []
    for relative, text in sorted(files.items()):
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            for pattern, meaning in SAVE_PATTERNS:
                if pattern.search(code):
                    found.append(f"{relative}:{number}: {meaning}: {line.strip()[:80]}")
                    break
    return found


def output_rule(trusted: bool, where: str) -> str:
    """What will happen to a run's outputs on ``where``, trusted or not."""
    if trusted:
        return (f"outputs on {where} (trusted compute): every file written to $TRAINMASTER_OUTPUT_DIR is kept and "
                "hashed; pickle-capable files (.pt, .ckpt, .pkl, torch.save or pickle content, zips holding pickles) "
                "are kept OPAQUE: never loaded by trainmaster, listed in the verdict. Files written elsewhere are not "
                "kept, and a run that writes none fails unless the spec says outputs.optional: true")
    return (f"outputs on {where} (untrusted compute): pickle-capable files (.pt, .ckpt, .pkl, torch.save or pickle "
            "content of any protocol whatever the name, archives holding pickles) and files whose content is not "
            "identified as safe (safetensors, text, JSON, CSV, images, numeric numpy, archives of those) are REFUSED "
            f"and the attempt is rejected, not paid; {CONVERT}")


def dry_run_warnings(code_dir: Path, *, trusted: bool, where: str, max_bundle_bytes: int) -> list[str]:
    """What `submit --dry-run` says about outputs: the rule for the chosen offer's trust, then each line of
    the bundled Python code that may write a pickle-capable file (outputs do not exist yet: "may")."""
    from trainmaster.jobs.bundle import collect

    sources = {}
    for entry in collect(code_dir, max_bytes=max_bundle_bytes):
        if entry.kind == "file" and entry.path.endswith(".py") and entry.size <= MAX_SCANNED_BYTES:
            sources[entry.path] = (Path(code_dir) / entry.path).read_text(encoding="utf-8", errors="replace")
            if len(sources) == MAX_SCANNED_FILES:
                break
    consequence = "kept opaque (never loaded)" if trusted else "refused, rejecting the attempt"
    found = [f"{line} — may write a pickle-capable output, {consequence}" for line in scan_sources(sources)]
    return [output_rule(trusted, where), *found]

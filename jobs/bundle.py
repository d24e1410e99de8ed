"""Deterministic, content-addressed job bundles, and their safe extraction.

A bundle is an uncompressed POSIX.1-2001 (pax) tar of the job's code directory plus the job spec
at `SPEC_MEMBER`, named by the sha256 of the tar bytes. Every non-ignored directory, regular file
and in-tree symlink becomes a member, sorted by POSIX relative path, with mtime 0, uid/gid 0,
empty owner names and normalised modes, so the same tree gives the same bytes on any machine.
Format, ignore rules and refusals: docs/bundle.md.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import io
import os
import platform
import posixpath
import shutil
import stat
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .files import fsync_dir
from .launcher_boot import FILTERS_PYTHONS
from .ignore import IGNORE_FILE, VENV_MARKER, IgnoreRules, always_ignored

SPEC_MEMBER = ".trainmaster/spec.json"
DEFAULT_MAX_BYTES = 2 * 1024**3
MAX_MEMBERS = 200_000  # a tar of millions of empty files would exhaust inodes while passing every size check

_SPEC_DIR = posixpath.dirname(SPEC_MEMBER)
_COPY_BUFSIZE = 4 * 1024**2  # read/hash/write chunk; large chunks keep per-call overhead negligible
_MAX_SPEC_BYTES = 16 * 1024**2
_MAX_META_BYTES = 1024**2  # pax and GNU long-name header payloads, which tarfile reads into memory
_FILE_MODE, _EXEC_MODE, _DIR_MODE, _LINK_MODE = 0o644, 0o755, 0o755, 0o777
_PRIVATE = 0o700  # extracted members keep only their owner's permission bits (docs/bundle.md)
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_TAR_TYPES = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE}
_ALLOWED_MEMBER_TYPES = frozenset(
    {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE}
)
_META_TYPES = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
)
_SPECIAL_TYPE_NAMES = {
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "fifo",
    tarfile.CONTTYPE: "contiguous file",
    tarfile.GNUTYPE_SPARSE: "sparse file",
}


class BundleError(Exception):
    """A bundle could not be built, read or extracted; the message names the path and the reason."""


@dataclass(frozen=True)
class BundleInfo:
    sha256: str  # lowercase hex of the tar bytes
    size: int  # tar size in bytes
    files: int  # regular files from the code directory (the spec member is not counted)
    path: Path | None  # where the tar was written, None for digest-only
    left_out: tuple[str, ...] = ()  # likely secrets the default rules kept out (ignore.SECRET_PATTERNS), sorted


@dataclass(frozen=True)
class Entry:
    """One member of a bundle, as it will be written."""

    path: str  # POSIX path relative to the code directory
    kind: str  # "file", "dir" or "symlink"
    mode: int  # normalised permission bits
    size: int = 0  # bytes, for files
    target: str = ""  # target relative to the link's directory, for symlinks
    data: bytes | None = None  # inline content (the spec); None means read it from the code dir


# --- building ----------------------------------------------------------------------------------


def collect(code_dir: Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[Entry]:
    """The entries of `code_dir` that go into its bundle, sorted by path.

    Applies the ignore rules and refuses, before anything is read or written: a missing code
    directory, a payload over `max_bytes`, a symlink leaving the tree or pointing at something
    left out, and device files, fifos and sockets.
    """
    return _collect(code_dir, max_bytes)[0]


def _collect(code_dir: Path, max_bytes: int) -> tuple[list[Entry], tuple[str, ...]]:
    """`collect`'s entries, and the paths left out as likely secrets."""
    root = _code_root(code_dir)
    left_out: list[str] = []
    entries = sorted(_walk(root, _ignore_rules(root), left_out), key=lambda e: e.path)
    _check_link_targets(entries)
    _check_payload(entries, max_bytes)
    return entries, tuple(sorted(left_out))


def bundle_digest(code_dir: Path, spec_json: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> BundleInfo:
    """The sha256 and size the bundle would have; writes nothing."""
    root, entries, left_out = _plan(code_dir, spec_json, max_bytes)
    sink = _HashingSink()
    _write_tar(root, entries, sink)
    return BundleInfo(sink.hexdigest(), sink.size, _count_code_files(entries), None, left_out)


def build_bundle(
    code_dir: Path, spec_json: bytes, dest_dir: Path, *, max_bytes: int = DEFAULT_MAX_BYTES
) -> BundleInfo:
    """Write the bundle to `dest_dir/<sha256>.tar` (created if missing) and describe it.

    The tar is hashed while it is written to a temp file in `dest_dir`, which is then fsynced
    and renamed into place; an existing bundle with that name is reused. On any error, a full
    disk included, the temp file is removed and nothing is left behind.
    """
    root, entries, left_out = _plan(code_dir, spec_json, max_bytes)
    dest_dir = Path(dest_dir)
    fd, tmp = _temp_file(dest_dir)
    try:
        sink = _HashingSink(fd, dest_dir)
        _write_tar(root, entries, sink)
        final = dest_dir / f"{sink.hexdigest()}.tar"
        _publish(fd, tmp, final, sink.size)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    return BundleInfo(sink.hexdigest(), sink.size, _count_code_files(entries), final, left_out)


def _plan(code_dir: Path, spec_json: bytes, max_bytes: int) -> tuple[Path, list[Entry], tuple[str, ...]]:
    """The code root, every entry of the bundle (the spec included, checked against the limit) and
    the paths left out as likely secrets."""
    if not isinstance(spec_json, bytes):
        raise TypeError(f"spec_json must be bytes (the spec's canonical JSON), not {type(spec_json).__name__}")
    root = _code_root(code_dir)
    spec_entries = [
        Entry(_SPEC_DIR, "dir", _DIR_MODE),
        Entry(SPEC_MEMBER, "file", _FILE_MODE, size=len(spec_json), data=spec_json),
    ]
    code_entries, left_out = _collect(root, max_bytes)
    entries = sorted(code_entries + spec_entries, key=lambda e: e.path)
    _check_payload(entries, max_bytes)
    return root, entries, left_out


def _code_root(code_dir: Path) -> Path:
    path = Path(code_dir)
    if not path.exists():
        raise BundleError(f"code directory {path} does not exist")
    if not path.is_dir():
        raise BundleError(f"code directory {path} is not a directory")
    return path.resolve()


def _ignore_rules(root: Path) -> IgnoreRules:
    try:
        return IgnoreRules.from_dir(root)
    except (OSError, UnicodeDecodeError) as e:
        raise BundleError(f"cannot read {root / IGNORE_FILE}: {e}") from e


def _walk(root: Path, rules: IgnoreRules, left_out: list[str]) -> Iterator[Entry]:
    """Every entry below `root` the rules keep, in no particular order; symlinks are not followed.
    What the secret defaults alone leave out is appended to `left_out` (a directory with a final `/`)."""
    pending = [""]
    while pending:
        rel_dir = pending.pop()
        for child in _list_dir(root / rel_dir):
            rel = f"{rel_dir}/{child.name}" if rel_dir else child.name
            st = _lstat(child)
            is_dir = stat.S_ISDIR(st.st_mode)
            if _is_ignored(child, rel, is_dir, rules):
                if rules.left_out_as_secret(rel, is_dir=is_dir) and not always_ignored(child.name):
                    left_out.append(rel + "/" if is_dir else rel)
                continue
            if is_dir:
                pending.append(rel)
                yield Entry(rel, "dir", _DIR_MODE)
            elif stat.S_ISREG(st.st_mode):
                yield Entry(rel, "file", _EXEC_MODE if st.st_mode & 0o111 else _FILE_MODE, size=st.st_size)
            elif stat.S_ISLNK(st.st_mode):
                yield Entry(rel, "symlink", _LINK_MODE, target=_link_target(root, rel))
            else:
                raise BundleError(
                    f"{rel} is a {_special_file_kind(st.st_mode)}; a bundle holds only files, directories "
                    f"and symlinks: remove it or add it to {IGNORE_FILE}"
                )


def _list_dir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError as e:
        raise BundleError(f"cannot list {path}: {e.strerror}") from e


def _lstat(child: os.DirEntry[str]) -> os.stat_result:
    try:
        return child.stat(follow_symlinks=False)
    except OSError as e:
        raise BundleError(f"cannot stat {child.path}: {e.strerror}") from e


def _is_ignored(child: os.DirEntry[str], rel: str, is_dir: bool, rules: IgnoreRules) -> bool:
    if always_ignored(child.name):
        return True
    if is_dir and os.path.lexists(os.path.join(child.path, VENV_MARKER)):
        return True
    return rules.ignored(rel, is_dir=is_dir)


def _special_file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device file"


def _link_target(root: Path, rel: str) -> str:
    """The target of the symlink `root/rel`, relative to its directory; refuses one leaving `root`."""
    link = root / rel
    resolved = os.path.realpath(link)
    if os.path.commonpath([resolved, root]) != str(root):
        raise BundleError(
            f"symlink {rel} -> {os.readlink(link)} resolves to {resolved}, outside the code directory {root}"
        )
    return os.path.relpath(resolved, link.parent)


def _check_link_targets(entries: list[Entry]) -> None:
    """Refuse symlinks whose target is not in the bundle: missing, ignored, or part of a loop."""
    kept = {e.path for e in entries if e.kind != "symlink"}
    for entry in entries:
        if entry.kind != "symlink":
            continue
        target = posixpath.normpath(posixpath.join(posixpath.dirname(entry.path), entry.target))
        if target != "." and target not in kept:
            raise BundleError(
                f"symlink {entry.path} -> {entry.target}: its target {target} is not in the bundle "
                "(missing, ignored, or a symlink loop)"
            )


def _check_payload(entries: list[Entry], max_bytes: int) -> None:
    total = sum(e.size for e in entries)
    if total <= max_bytes:
        return
    largest = heapq.nlargest(3, (e for e in entries if e.kind == "file"), key=lambda e: e.size)
    names = ", ".join(f"{e.path} ({_human(e.size)})" for e in largest)
    raise BundleError(
        f"bundle would be {_human(total)}, over the {_human(max_bytes)} limit; "
        f"add patterns to {IGNORE_FILE} (largest files: {names})"
    )


def _count_code_files(entries: list[Entry]) -> int:
    return sum(1 for e in entries if e.kind == "file" and e.data is None)


class _HashingSink:
    """A write-only file object for TarFile: hashes every byte and, given a descriptor, writes it.

    Writes go straight to the descriptor (no buffer), so after a failed write nothing is pending
    that a later close could fail on again.
    """

    def __init__(self, fd: int | None = None, dest_dir: Path | None = None) -> None:
        self._hash = hashlib.sha256()
        self._fd = fd
        self._dest_dir = dest_dir
        self.size = 0

    def write(self, data: bytes) -> int:
        self._hash.update(data)
        if self._fd is not None:
            self._write_all(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as e:
            raise _write_error(e, self._dest_dir) from e


def _write_tar(root: Path, entries: list[Entry], sink: _HashingSink) -> None:
    with tarfile.open(
        fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8", copybufsize=_COPY_BUFSIZE
    ) as tar:
        for entry in entries:
            _add_entry(tar, root, entry)


def _add_entry(tar: tarfile.TarFile, root: Path, entry: Entry) -> None:
    info = _tarinfo(entry)
    if entry.data is not None:
        tar.addfile(info, io.BytesIO(entry.data))
    elif entry.kind == "file":
        with _open_source(root, entry) as source:
            try:
                tar.addfile(info, source)
            except OSError as e:  # reading: write errors reach here as BundleError
                raise BundleError(f"cannot read {entry.path}: {e}") from e
    else:
        tar.addfile(info)


def _tarinfo(entry: Entry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.path)
    info.type = _TAR_TYPES[entry.kind]
    info.mode = entry.mode
    info.size = entry.size
    info.linkname = entry.target
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _open_source(root: Path, entry: Entry) -> BinaryIO:
    """Open a file to bundle, refusing one that changed since the scan (size, type, symlink swapped in)."""
    try:
        fd = os.open(root / entry.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise BundleError(f"cannot read {entry.path}: {e.strerror}") from e
    source = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
        source.close()
        raise BundleError(f"{entry.path} changed while the bundle was being built; build again")
    return source


def _temp_file(dest_dir: Path) -> tuple[int, Path]:
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=dest_dir, prefix=".bundle-", suffix=".tmp")
    except OSError as e:
        raise _write_error(e, dest_dir) from e
    return fd, Path(name)


def _publish(fd: int, tmp: Path, final: Path, size: int) -> None:
    """Move the finished temp file to its content address, or drop it when that bundle exists."""
    if final.is_file() and final.stat().st_size == size:
        tmp.unlink()
        return
    try:
        os.fsync(fd)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except OSError as e:
        raise _write_error(e, final.parent) from e


def _write_error(e: OSError, dest_dir: Path | None) -> BundleError:
    if e.errno in _NO_SPACE:
        return BundleError(f"no space left to write the bundle in {dest_dir}: {e.strerror}")
    return BundleError(f"cannot write the bundle in {dest_dir}: {e.strerror}")


# --- reading and extracting --------------------------------------------------------------------


def extract_bundle(
    tar_path: Path,
    dest: Path,
    *,
    max_member_bytes: int = DEFAULT_MAX_BYTES,
    max_total_bytes: int = DEFAULT_MAX_BYTES,
    expected_sha256: str | None = None,
) -> None:
    """Extract a bundle to `dest`, which must not exist, refusing anything unsafe.

    Every header is checked before any data is read or written (names, types, declared sizes,
    duplicates, links); the members are then extracted, with tarfile's "data" filter as a second
    line of defence, into a temporary sibling of `dest` that is renamed into place. On refusal
    nothing is left at `dest` or in the temporary directory.
    """
    require_extraction_filters()
    tar_path, dest = Path(tar_path), Path(dest)
    if os.path.lexists(dest):
        raise BundleError(f"extraction destination {dest} already exists")
    with _open_file(tar_path) as raw:
        if expected_sha256 is not None:
            _check_sha256(raw, tar_path, expected_sha256)
        with _open_tar(raw, tar_path) as tar:
            members = _validated_members(tar, tar_path, max_member_bytes, max_total_bytes)
            _extract_atomically(tar, tar_path, members, dest)


def read_spec(tar_path: Path) -> bytes:
    """The bytes of the bundle's `SPEC_MEMBER`, after the same header checks as extraction."""
    return read_member(tar_path, SPEC_MEMBER, _MAX_SPEC_BYTES)


def read_member(tar_path: Path, name: str, max_bytes: int) -> bytes:
    """The bytes of one regular file of the bundle (a path of the code dir, or `SPEC_MEMBER`), after the same
    header checks as extraction; BundleError when it is missing, not a file, or over `max_bytes`."""
    tar_path = Path(tar_path)
    with _open_file(tar_path) as raw, _open_tar(raw, tar_path) as tar:
        members = _validated_members(tar, tar_path, DEFAULT_MAX_BYTES, DEFAULT_MAX_BYTES)
        member = members.get(_normalise(name, name))
        if member is None or not member.isreg():
            raise BundleError(f"{tar_path} has no {name}")
        if member.size > max_bytes:
            raise BundleError(f"{tar_path}: {name} is {_human(member.size)}, over {_human(max_bytes)}")
        try:
            return tar.extractfile(member).read()
        except tarfile.TarError as e:
            raise BundleError(f"{tar_path}: cannot read {name}: {e}") from e


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses oversized pax and GNU long-name headers before tarfile reads them into memory."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > _MAX_META_BYTES:
            raise BundleError(
                f"the header at offset {self.offset} declares {_human(self.size)} of metadata, "
                f"over {_human(_MAX_META_BYTES)}"
            )
        return super()._proc_member(tar)


def _open_file(tar_path: Path) -> BinaryIO:
    try:
        return open(tar_path, "rb")
    except OSError as e:
        raise BundleError(f"cannot open bundle {tar_path}: {e.strerror}") from e


def _check_sha256(raw: BinaryIO, tar_path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    while chunk := raw.read(_COPY_BUFSIZE):
        digest.update(chunk)
    raw.seek(0)
    if digest.hexdigest() != expected.lower():
        raise BundleError(f"{tar_path} has sha256 {digest.hexdigest()}, expected {expected}")


def _open_tar(raw: BinaryIO, tar_path: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=raw, mode="r:", tarinfo=_BoundedTarInfo, errorlevel=2)
    except tarfile.TarError as e:
        raise BundleError(f"{tar_path} is not a readable tar: {e}") from e


def _validated_members(
    tar: tarfile.TarFile, tar_path: Path, max_member_bytes: int, max_total_bytes: int
) -> dict[str, tarfile.TarInfo]:
    """The members by normalised name, once every header has passed every check."""
    members = _scan_headers(tar, tar_path, max_member_bytes, max_total_bytes)
    _check_tree(members)
    return members


def _scan_headers(
    tar: tarfile.TarFile, tar_path: Path, max_member_bytes: int, max_total_bytes: int
) -> dict[str, tarfile.TarInfo]:
    """Read the headers only (tarfile seeks over the data), checking each member on its own.

    A member is refused on its declared size before the next header, and so its data, is read.
    """
    members: dict[str, tarfile.TarInfo] = {}
    total = 0
    try:
        for member in tar:
            name = _normalise(member.name, f"member {member.name!r}")
            _check_type(member)
            _check_size(member, max_member_bytes)
            total += member.size
            if total > max_total_bytes:
                raise BundleError(
                    f"member {member.name!r} brings the declared size to {_human(total)}, "
                    f"over the {_human(max_total_bytes)} total limit"
                )
            if name in members:
                raise BundleError(f"duplicate member {member.name!r}")
            members[name] = member
            if len(members) > MAX_MEMBERS:
                raise BundleError(f"{tar_path} has more than {MAX_MEMBERS:,} members")
    except tarfile.TarError as e:
        raise BundleError(f"{tar_path} is damaged: {e}") from e
    return members


def _normalise(path: str, label: str) -> str:
    """`path` without `.` and empty components; refuses absolute paths, `..`, NUL and empty names."""
    if path.startswith("/"):
        raise BundleError(f"{label} is an absolute path")
    if "\0" in path:
        raise BundleError(f"{label} contains a NUL byte")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BundleError(f"{label} has a '..' component")
    if not parts:
        raise BundleError(f"{label} is empty")
    return "/".join(parts)


def _check_type(member: tarfile.TarInfo) -> None:
    if member.type not in _ALLOWED_MEMBER_TYPES or member.sparse is not None:
        kind = "sparse file" if member.sparse is not None else _SPECIAL_TYPE_NAMES.get(member.type)
        raise BundleError(f"member {member.name!r} is a {kind or f'type {member.type!r} member'}, not allowed")


def _check_size(member: tarfile.TarInfo, max_member_bytes: int) -> None:
    if member.size < 0:
        raise BundleError(f"member {member.name!r} declares a negative size")
    if member.size > max_member_bytes:
        raise BundleError(
            f"member {member.name!r} declares {_human(member.size)}, "
            f"over the {_human(max_member_bytes)} per-member limit"
        )


def _check_tree(members: dict[str, tarfile.TarInfo]) -> None:
    """Checks that need the whole member list, so that member order cannot defeat them."""
    order = {name: i for i, name in enumerate(members)}
    for name, member in members.items():
        _check_parents(name, members)
        if member.issym():
            _check_symlink(name, member, members)
        elif member.islnk():
            _check_hardlink(name, member, members, order)


def _check_parents(name: str, members: dict[str, tarfile.TarInfo]) -> None:
    """Refuse a member whose path goes through a symlink (or a file) member."""
    parts = name.split("/")
    for i in range(1, len(parts)):
        parent = members.get("/".join(parts[:i]))
        if parent is not None and parent.issym():
            raise BundleError(f"member {name!r} goes through the symlink member {parent.name!r}")
        if parent is not None and not parent.isdir():
            raise BundleError(f"member {name!r} goes through {parent.name!r}, which is not a directory")


def _check_symlink(name: str, member: tarfile.TarInfo, members: dict[str, tarfile.TarInfo]) -> None:
    """Refuse a symlink whose target is absolute, leaves the tree, or passes through another symlink.

    With no symlink on the way, the lexical walk below is exactly where the link will resolve.
    """
    target = member.linkname
    label = f"symlink {name!r} -> {target!r}"
    if not target or target.startswith("/") or "\0" in target:
        raise BundleError(f"{label}: the target must be a relative path")
    parts = name.split("/")[:-1]
    for component in target.split("/"):
        if component in ("", "."):
            continue
        if component == "..":
            if not parts:
                raise BundleError(f"{label} points outside the bundle")
            parts.pop()
            continue
        parts.append(component)
        hop = members.get("/".join(parts))
        if hop is not None and hop.issym():
            raise BundleError(f"{label} goes through the symlink member {hop.name!r}")


def _check_hardlink(
    name: str, member: tarfile.TarInfo, members: dict[str, tarfile.TarInfo], order: dict[str, int]
) -> None:
    """A hardlink must name an earlier regular-file member, never a path outside the tree."""
    label = f"hardlink {name!r} -> {member.linkname!r}"
    target_name = _normalise(member.linkname, label)
    target = members.get(target_name)
    if target is None or not target.isreg() or order[target_name] >= order[name]:
        raise BundleError(f"{label} does not point to an earlier regular file in the bundle")


def require_extraction_filters() -> None:
    """Refuse, saying why, on a Python without tarfile's extraction filters (PEP 706: 3.12, and backported to
    3.10.12 and 3.11.4; Debian 12's own 3.11.2 has none), which every extracted member passes as a second check."""
    if not hasattr(tarfile, "data_filter"):
        raise BundleError(
            f"this Python ({platform.python_version()}, {sys.executable}) has no tarfile extraction filters (PEP 706), "
            f"which every extracted member passes: trainmaster needs Python {FILTERS_PYTHONS}"
        )


def _extract_atomically(
    tar: tarfile.TarFile, tar_path: Path, members: dict[str, tarfile.TarInfo], dest: Path
) -> None:
    try:
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    except OSError as e:
        raise BundleError(f"cannot create a temporary directory next to {dest}: {e.strerror}") from e
    try:
        _extract_members(tar, tar_path, list(members.values()), tmp)
        os.chmod(tmp, _DIR_MODE & _PRIVATE)
        _rename_new(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _extract_members(tar: tarfile.TarFile, tar_path: Path, members: list[tarfile.TarInfo], into: Path) -> None:
    try:
        tar.extractall(into, members=members, filter=_private_data_filter)
    except tarfile.FilterError as e:
        raise BundleError(f"member {e.tarinfo.name!r} refused by tarfile's data filter: {e}") from e
    except (tarfile.TarError, OSError) as e:
        raise BundleError(f"cannot extract {tar_path}: {e}") from e


def _private_data_filter(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo:
    """tarfile's "data" filter, with group and other permissions dropped: extracted code is its owner's alone."""
    member = tarfile.data_filter(member, dest_path)
    return member if member.mode is None else member.replace(mode=member.mode & _PRIVATE, deep=False)


def _rename_new(tmp: Path, dest: Path) -> None:
    if os.path.lexists(dest):
        raise BundleError(f"extraction destination {dest} appeared while extracting")
    try:
        os.rename(tmp, dest)
    except OSError as e:
        raise BundleError(f"cannot move the extracted bundle to {dest}: {e.strerror}") from e


def _human(size: float) -> str:
    """A byte count for messages: 3328599654 -> '3.1 GiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"

"""A confined job's private view of the files, made in its own mount namespace (Linux, as root).

Called in the job's child process between fork and exec (sandbox.py), before it drops to its user:

1. a new mount namespace (and, unless the job keeps the network, a new network namespace holding only
   a loopback, brought up), with `/` made recursively private so nothing leaks back to the machine;
2. every mount of the machine, `/proc` and `/sys` aside, remounted read-only (its nosuid, nodev, noexec
   and atime flags kept): the job can write nowhere but where step 5 lets it;
3. fresh empty tmpfs over the shared scratch folders (`/tmp`, `/var/tmp`, `/dev/shm`), private to the job;
4. an empty read-only-to-the-job tmpfs over each covered folder (the miner's home, the paths it hides,
   the folders the job's user could not pass through anyway); a covered file gets `/dev/null`;
5. bind mounts, opened before anything was covered, that bring back exactly the folders the job needs:
   the interpreter's prefixes and trainmaster's own code read-only, the job's work dir read-write;
6. a hidden path that step 5 brought back (it lay inside a needed folder) covered again.

Standard library only (ctypes libc), so the supervisor starts without delay.
"""

from __future__ import annotations

import ctypes
import os
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = 1024, 2048, 4096, 16384, 1 << 18, 1 << 21
_STATVFS_TO_MS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
                  os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME}
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
PSEUDO = ("/proc", "/sys")
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def make(*, read_only: list[str], writable: str, covers: list[str], hide: list[str], network: bool) -> None:
    """Build the view (module docstring). All paths absolute and resolved; raises OSError naming what failed."""
    _libc("unshare", CLONE_NEWNS | (0 if network else CLONE_NEWNET))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    needed = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in [*read_only, writable]}
    for point in _mount_points():
        if not any(inside(point, p) for p in PSEUDO):
            _remount(point, read_only=True)
    for scratch in SCRATCH:
        if os.path.isdir(scratch) and not os.path.islink(scratch):
            _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path in sorted(set(covers) | set(hide), key=_depth):
        _cover(path)
    for path in sorted(needed, key=_depth):
        os.makedirs(path, mode=0o755, exist_ok=True)  # the way down to it, inside a cover
        _mount(f"/proc/self/fd/{needed[path]}", path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | (MS_RDONLY if path != writable else 0))
        os.close(needed[path])
    for path in hide:
        if any(inside(path, p) and path != p for p in needed):
            _cover(path)
    if not network:
        _loopback_up()


def inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _cover(path: str) -> None:
    """An empty root-owned tmpfs over a folder, /dev/null over a file; nothing for a path this view does not
    show (it lies under an earlier cover)."""
    if not os.path.lexists(path):
        return
    if os.path.isdir(path):
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=1m")
    else:
        _mount("/dev/null", path, None, MS_BIND)


def _remount(point: str, *, read_only: bool) -> None:
    try:
        kept = os.statvfs(point).f_flag
    except OSError:  # a mount point the view no longer reaches (stacked under another)
        return
    flags = sum(ms for st, ms in _STATVFS_TO_MS.items() if kept & st)
    _mount(None, point, None, MS_REMOUNT | MS_BIND | flags | (MS_RDONLY if read_only else 0))


def _mount_points() -> list[str]:
    """Every mount point of this namespace, from /proc/self/mountinfo (its octal escapes undone)."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted({p.encode().decode("unicode_escape").encode("latin-1").decode() for p in points}, key=_depth)


def _loopback_up() -> None:
    """The new network namespace's `lo` up, so the job's own processes (torchrun, gloo) can reach each other."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14s", b"lo", 0, b"")))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _libc("mount", _c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data), what=f"mount {target}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _libc(name: str, *args, what: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what or name}: {os.strerror(err)}")

"""Hostile outputs folders, built cheaply (sparse files, one compressed member shared by many entries):
what a malicious executor could leave for `trainmaster verify DIR`. Used by tests/verify/test_hostile_bytes.py
and tests/benchmarks/bench_hostile.py."""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import zlib
from pathlib import Path

SECRET = "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"


def outputs(root: Path) -> Path:
    """A fresh outputs folder holding one harmless file (so "no outputs" is never the reason)."""
    root.mkdir(parents=True)
    (root / "log.txt").write_text("trained\n")
    return root


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk space (a hole), as `truncate -s` makes."""
    with open(path, "wb") as handle:
        handle.truncate(size)
    return path


def secret_link(root: Path, name: str = "commitment.json") -> Path:
    """``name`` as a symbolic link to a file holding a fake secret, as /proc/self/environ would."""
    secret = root.parent / f"{root.name}-environ"
    secret.write_text(SECRET + "\n")
    (root / name).symlink_to(secret)
    return root / name


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def unix_socket(path: Path) -> Path:
    """A socket file at ``path`` (bound in a short temporary folder, as a socket's path is at most
    ~108 bytes, then moved: the entry stays a socket)."""
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        bound = Path(short) / "s"
        server = socket.socket(socket.AF_UNIX)
        try:
            server.bind(str(bound))
        finally:
            server.close()
        os.replace(bound, path)
    return path


def deep_tree(root: Path, depth: int) -> Path:
    """``depth`` nested folders ``x/x/…`` with a file at the bottom (one component at a time, since
    the whole path can pass PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("x", dir_fd=fd)
            inner = os.open("x", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        bottom = os.open("bottom.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(bottom, b"deep\n")
        os.close(bottom)
    finally:
        os.close(fd)
    return root


def remove_deep_tree(root: Path) -> None:
    """Undo :func:`deep_tree` one level at a time (shutil.rmtree, and so pytest's clean-up, recurses
    once per level and fails on 1,200): the folder below the top one is moved up in its place."""
    top = root / "x"
    while top.is_dir():
        for entry in os.scandir(top):
            if entry.name != "x":
                os.unlink(entry.path)
        if (top / "x").is_dir():
            os.rename(top / "x", root / "x.next")
            os.rmdir(top)
            os.rename(root / "x.next", top)
        else:
            os.rmdir(top)


def tensor_file(path: Path, shape: list[int]) -> Path:
    """A safetensors file of one F32 tensor of ``shape`` holding no bytes (a 0 somewhere in the shape)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def zip_bomb(path: Path, *, entries: int, member_mib: int) -> Path:
    """A zip whose ``entries`` central-directory entries all point at one deflated member: ``{`` and
    ``member_mib`` MiB of spaces (JSON-looking, so a naive inspection decompresses it all, each time)."""
    body = b"{" + b" " * (member_mib * 2**20 - 1)
    squeezer = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = squeezer.compress(body) + squeezer.flush()
    crc, name = zlib.crc32(body), b"data"
    fields = (20, 0, 8, 0, 0, crc, len(data), len(body), len(name), 0)
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", *fields) + name
    central = b"".join(
        struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, *fields, 0, 0, 0, 0, 0) + name for _ in range(entries)
    )
    start = len(local) + len(data)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, entries, entries, len(central), start, 0)
    path.write_bytes(local + data + central + end)
    return path


def huge_step_metrics(path: Path) -> Path:
    """A metrics.jsonl whose last step is 10**400 (a float cannot hold it)."""
    path.write_text(json.dumps({"step": 10}) + "\n" + '{"step": 1' + "0" * 400 + "}\n")
    return path

"""User files are read bounded (jobs/userfile.py): regular files only, opened without blocking, at most a cap; what
is refused names the file and why and holds none of its bytes."""

from __future__ import annotations

import os
import socket
import time

import pytest

from trainmaster.jobs.userfile import UnreadableFile, read_user_file


def test_a_fifo_without_a_writer_is_refused_at_once(tmp_path):
    fifo = tmp_path / "policy.yaml"
    os.mkfifo(fifo)
    began = time.monotonic()
    with pytest.raises(UnreadableFile, match="is a FIFO"):
        read_user_file(fifo)
    assert time.monotonic() - began < 1


@pytest.mark.parametrize("path, kind", [("/dev/zero", "a character device"), ("/", "a directory")])
def test_devices_and_folders_are_refused_unread(path, kind):
    with pytest.raises(UnreadableFile) as refused:
        read_user_file(path)
    assert str(refused.value) == f"{path}: is {kind}, not a regular file; it is not read"


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(UnreadableFile, match="not a regular file"):
            read_user_file(path)


def test_a_file_over_the_cap_is_refused_and_a_link_to_a_small_one_read(tmp_path):
    big, small, link = tmp_path / "big.yaml", tmp_path / "small.yaml", tmp_path / "link.yaml"
    big.write_bytes(b"x" * 2000)
    small.write_bytes(b"name: ok\n")
    link.symlink_to(small)
    with pytest.raises(UnreadableFile, match="is 2000 bytes, over the limit of 1000 bytes") as refused:
        read_user_file(big, 1000)
    assert "xxxx" not in str(refused.value)
    assert read_user_file(link) == b"name: ok\n"
    with pytest.raises(FileNotFoundError):
        read_user_file(tmp_path / "missing.yaml")

"""jobs/files.py: the chunked sha256 equals hashlib's, and an atomic write never leaves a torn file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from trainmaster.jobs import files


@pytest.mark.parametrize("size", [0, 1, files.READ_CHUNK - 1, files.READ_CHUNK, 2 * files.READ_CHUNK + 7])
def test_sha256_file_equals_hashlib_over_the_whole_file(tmp_path, size):
    data = os.urandom(size)
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert files.sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert files.sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


def test_write_bytes_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")
    files.write_bytes_atomic(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_write_bytes_atomic_is_owner_only_whatever_the_umask(tmp_path):
    umask = os.umask(0o022)
    try:
        path = tmp_path / "out.bin"
        files.write_bytes_atomic(path, b"x")
    finally:
        os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o600


def test_write_json_atomic_sorts_keys(tmp_path):
    path = tmp_path / "out.json"
    files.write_json_atomic(path, {"b": 1, "a": {"d": [1, 2], "c": None}})
    text = path.read_text(encoding="utf-8")
    assert text == json.dumps({"a": {"c": None, "d": [1, 2]}, "b": 1}, indent=2) + "\n"
    assert json.loads(text) == {"a": {"c": None, "d": [1, 2]}, "b": 1}


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failure_mid_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch, failing):
    path = tmp_path / "state.json"
    path.write_bytes(b"old")

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, failing, fail)
    with pytest.raises(OSError, match="No space left"):
        files.write_bytes_atomic(path, b"new" * 1000)
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_process_killed_mid_write_leaves_the_old_file_whole(tmp_path):
    """A real crash: the writer dies (os._exit, no cleanup) after writing most of the new data."""
    path = tmp_path / "state.bin"
    path.write_bytes(b"old" * 1000)
    script = textwrap.dedent(
        f"""
        import os
        from trainmaster.jobs import files

        real_fdopen = os.fdopen

        class Dying:
            def __init__(self, handle):
                self.handle = handle
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                return False
            def write(self, data):
                self.handle.write(data[: len(data) // 2])
                self.handle.flush()
                os._exit(9)

        files.os.fdopen = lambda fd, mode: Dying(real_fdopen(fd, mode))
        files.write_bytes_atomic({str(path)!r}, b"new" * 100_000)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 9, done.stderr
    assert path.read_bytes() == b"old" * 1000
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "state.bin"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".state.bin.") and leftovers[0].endswith(".tmp")
    assert (tmp_path / leftovers[0]).stat().st_size == 150_000  # the half-written new data never replaced it


def test_concurrent_writers_of_one_path_use_separate_temporaries(tmp_path, monkeypatch):
    """Two writers must not share a temporary file (one would truncate the other's data)."""
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(os.fspath(src))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", spy)
    files.write_bytes_atomic(tmp_path / "x", b"1")
    files.write_bytes_atomic(tmp_path / "x", b"2")
    assert len(set(seen)) == 2
    assert (tmp_path / "x").read_bytes() == b"2"


def test_an_exclusive_lock_is_refused_to_a_second_process_until_the_first_lets_go(tmp_path):
    import os
    import subprocess
    import sys

    from trainmaster.jobs.files import try_exclusive_lock

    path = tmp_path / "held.lock"
    probe = [sys.executable, "-c", "import sys; from trainmaster.jobs.files import try_exclusive_lock as t; "
             "print(t(sys.argv[1]) is None)", str(path)]
    fd = try_exclusive_lock(path)
    assert fd is not None and (os.stat(path).st_mode & 0o777) == 0o600
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "True"
    os.close(fd)
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "False"

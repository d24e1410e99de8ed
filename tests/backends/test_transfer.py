"""The transfer helper every backend fetches through, and the one place backend calls are retried."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from trainmaster.backends import transfer
from trainmaster.backends.base import BackendError, TransientBackendError
from trainmaster.backends.retry import retried
from trainmaster.broker.cli.transfer_bar import TransferBar

DATA = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(DATA).hexdigest()


def sender(data: bytes, *, stop_at: int | None = None, chunk: int = 65536):
    """`read(offset)` over `data`; stops early (a dropped connection) at `stop_at` the first time."""
    calls = []

    async def read(offset: int):
        calls.append(offset)
        end = stop_at if stop_at is not None and len(calls) == 1 else len(data)
        for i in range(offset, end, chunk):
            yield data[i:min(i + chunk, end)]

    read.calls = calls
    return read


def test_a_dropped_download_resumes_from_the_bytes_on_disk(tmp_path):
    read, seen = sender(DATA, stop_at=300_000), []
    dest = tmp_path / "w.bin"
    with pytest.raises(TransientBackendError, match="stopped at"):
        asyncio.run(transfer.download(read, dest, size=len(DATA), sha256=SHA))
    assert not dest.exists() and (tmp_path / "w.bin.partial").stat().st_size >= 300_000
    got = asyncio.run(transfer.download(read, dest, size=len(DATA), sha256=SHA, progress=lambda d, t: seen.append(d)))
    assert got.sha256 == SHA and dest.read_bytes() == DATA
    assert read.calls[1] >= 300_000 and seen[-1] == len(DATA)  # asked only for the rest
    assert not (tmp_path / "w.bin.partial").exists()


def test_a_download_that_lies_about_its_hash_or_size_is_refused(tmp_path):
    dest = tmp_path / "w.bin"
    with pytest.raises(BackendError, match="differs from the announced"):
        asyncio.run(transfer.download(sender(DATA), dest, size=len(DATA), sha256="0" * 64))
    assert not dest.exists() and not (tmp_path / "w.bin.partial").exists()
    with pytest.raises(BackendError, match="more than the 1000 bytes"):
        asyncio.run(transfer.download(sender(DATA), dest, size=1000, sha256=SHA))
    assert not dest.exists()


def test_a_download_of_many_batches_is_hashed_and_written_in_order_and_resumes_after_a_drop_or_a_cancel(tmp_path):
    big = bytes(range(251)) * (3 * transfer.CHUNK // 251 + 7)  # several batches written off the event loop
    sha = hashlib.sha256(big).hexdigest()
    dest = tmp_path / "big.bin"
    with pytest.raises(TransientBackendError, match="stopped at"):
        asyncio.run(transfer.download(sender(big, stop_at=2 * transfer.CHUNK + 12345), dest, size=len(big), sha256=sha))
    assert (tmp_path / "big.bin.partial").stat().st_size == 2 * transfer.CHUNK + 12345  # every byte received kept

    async def cancelled_midway():
        arrived = asyncio.Event()

        def seen(done, _total):
            if done > 5 * transfer.CHUNK // 2:
                arrived.set()

        task = asyncio.create_task(transfer.download(sender(big), dest, size=len(big), sha256=sha, progress=seen))
        await arrived.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled_midway())  # the file is closed only once its write in flight has landed
    kept = (tmp_path / "big.bin.partial").read_bytes()
    assert big.startswith(kept)
    got = asyncio.run(transfer.download(sender(big), dest, size=len(big), sha256=sha))
    assert got.sha256 == sha and dest.read_bytes() == big and not (tmp_path / "big.bin.partial").exists()


def test_copy_tree_is_atomic_hashes_every_file_and_reports_progress(tmp_path):
    source = tmp_path / "out"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(DATA)
    (source / "sub" / "b.txt").write_text("b")
    (source / "link").symlink_to("/etc/passwd")
    seen = []
    files = asyncio.run(transfer.copy_tree(source, tmp_path / "dest", lambda d, t: seen.append((d, t))))
    assert [(f.path, f.sha256) for f in files] == [("a.bin", SHA), ("sub/b.txt", hashlib.sha256(b"b").hexdigest())]
    assert not (tmp_path / "dest" / "link").exists()  # links are not outputs
    assert seen[-1] == (len(DATA) + 1, len(DATA) + 1)
    assert asyncio.run(transfer.copy_tree(source, tmp_path / "dest")) == files  # idempotent


def test_only_transient_errors_are_retried_and_only_a_few_times(monkeypatch):
    import trainmaster.backends.retry as retry

    monkeypatch.setattr(retry, "MAX_WAIT_S", 0.01)
    calls = []

    async def flaky(fail: int, error: type[Exception]):
        calls.append(1)
        if len(calls) <= fail:
            raise error("not now")
        return "ok"

    assert asyncio.run(retried(flaky, 2, TransientBackendError)) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(BackendError):
        asyncio.run(retried(flaky, 5, BackendError))
    assert len(calls) == 1  # permanent: not retried
    calls.clear()
    with pytest.raises(TransientBackendError):
        asyncio.run(retried(flaky, 99, TransientBackendError))
    assert len(calls) == retry.ATTEMPTS


class Terminal:
    def __init__(self):
        self.text = []

    def isatty(self):
        return True

    def write(self, text):
        self.text.append(text)

    def flush(self):
        pass


def test_the_transfer_bar_draws_only_large_transfers_on_a_terminal():
    quiet, tty = TransferBar(), Terminal()
    quiet(10, 100)  # stderr is not a terminal under pytest: nothing drawn, nothing started
    assert quiet._bar is None
    bar = TransferBar(stream=tty)
    bar(1, 1000)
    assert bar._bar is None and not tty.text  # small: no bar
    bar(10 * 2**20, 20 * 2**20)
    assert bar._bar is not None
    bar(20 * 2**20, 20 * 2**20)
    assert bar._bar is None and tty.text  # drawn, then finished

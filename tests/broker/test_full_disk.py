"""#33 §9: a full disk on the broker's side is our environment: commands end cleanly, nothing partial is kept, and
reads keep working; once space is freed the job carries on, and the miner is blamed for nothing.

The broker's home is on a small tmpfs of its own (mounted for the test: the machines run tests as root), the miner a
real `trainmaster miner serve` process elsewhere. First the disk has room for the state but not for the outputs with
the state database's reserve: `submit --wait` stops with what to fix, before a byte of the outputs is written. Then
the disk is filled to the last byte: `status` and `ls` still answer from the record (exit 2, a warning, no
traceback). Space freed, `status` fetches, verifies and accepts, paying the honest miner once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from miner_support import MinerProcess, make_wallet
from tiny_lm_job import EVALUATOR, JOB, TINY_LM

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}
POLICY = "name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\nverification:\n  tau: 0.01\n"
DISK_MB = 320


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m,mode=0700", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the full-disk test (run the tests as root): {done.stderr}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path, leave_bytes: int) -> None:
    """Write `path` until the disk holding it has `leave_bytes` free (0: until the disk is full).

    Unbuffered: with a buffer, the bytes a full disk refused stayed in it and closing the file raised ENOSPC again
    (the broker's background pass may take the last pages between the free-space reading and the write)."""
    with open(path, "ab", buffering=0) as f:
        while True:
            free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
            if free <= leave_bytes:
                return
            try:
                f.write(b"\0" * min(free - leave_bytes, 8 << 20))
            except OSError:
                return


def _tm(home, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "200"}, timeout=280)


def test_a_full_disk_ends_commands_cleanly_keeps_nothing_partial_and_reads_keep_working(tmp_path, small_disk):
    wallets = tmp_path / "wallets"
    miner = MinerProcess(tmp_path / "miner", make_wallet(wallets, "miner"), config=PRICES).start()
    try:
        make_wallet(wallets, "broker")
        home = small_disk / "home"
        (home / "config").mkdir(parents=True)
        (home / "config" / "backends.yaml").write_text(
            f"bittensor:\n  wallet:\n    name: broker\n    path: {wallets}\n  quote_timeout_s: 5\n"
            f"  miners:\n    - hotkey: {miner.hotkey}\n      url: {miner.url}\n")
        job = tmp_path / "job"
        job.mkdir()
        (job / "job.yaml").write_text(JOB.format(entrypoint=TINY_LM.format(steps=100)))
        (job / "evaluate.py").write_text(EVALUATOR)
        (tmp_path / "policy.yaml").write_text(POLICY)
        filler = small_disk / "filler"
        _fill(filler, leave_bytes=(DISK_MB - 260) << 20)  # room for the state, not for the outputs and the reserve

        done = _tm(home, "submit", str(job / "job.yaml"), "--policy", str(tmp_path / "policy.yaml"), "--wait")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "free some space" in done.stderr, done.stderr
        [listed] = json.loads(_tm(home, "ls", "--json").stdout)
        job_dir = home / "jobs" / listed["id"]
        assert not [p for p in job_dir.rglob("*") if ".partial" in p.name or "outputs" in p.parts]

        _fill(filler, leave_bytes=0)  # now not a byte is left
        for args in (["status", listed["id"], "--json"], ["ls", "--json"], ["status", listed["id"]]):
            read = _tm(home, *args)
            assert "Traceback" not in read.stderr, (args, read.stderr[-3000:])
            assert read.returncode in (0, 2) and listed["id"] in read.stdout, (args, read.stdout, read.stderr)
        assert json.loads(_tm(home, "status", listed["id"], "--json").stdout)["state"] == "returned"

        filler.unlink()  # space freed: the background pass the next read starts (or runs already) carries on
        deadline = time.time() + 120
        while (shown := json.loads(_tm(home, "status", listed["id"], "--json").stdout))["state"] != "accepted" \
                and time.time() < deadline:
            time.sleep(0.5)
        assert shown["state"] == "accepted", shown
        assert [p["payee"] for p in shown["payments"]] == [miner.wallet.coldkeypub.ss58_address] or \
            [p["attempt_id"] for p in shown["payments"]] == [shown["attempts"][0]["id"]]
        assert not json.loads(_tm(home, "executors", "ls", "--json").stdout)["bans"]
    finally:
        miner.stop()

"""The checkpoint writer's one pass (hash and write each run of chunks on the pool): a failed write mid-file."""

from __future__ import annotations

import errno
import os
import threading
import time

import pytest
import torch

from trainmaster.jobs import checkpoint
from trainmaster.jobs.checkpoint import CheckpointError, kept_indices, read_segment, segment_dir, write_segment
from trainmaster.jobs.state import TrainState


def _state() -> TrainState:
    weights = {f"w{i}": torch.full((1_000_000,), float(i)) for i in range(6)}  # 24 MB: hashed and written on the pool
    return TrainState(weights=weights, rest={"opt/step": torch.tensor(1.0)})


def test_a_full_disk_mid_file_is_a_checkpoint_error_and_no_write_outlives_it(tmp_path, monkeypatch):
    """The third run's write fails (ENOSPC): CheckpointError names the segment, the half-written segment is
    gone, the earlier one reads back whole, and no pool thread writes after write_segment has returned
    (its file descriptor is closed then, and its number may be another file's)."""
    write_segment(tmp_path, 0, _state(), {}, job_id="j", recipe="r", step=0, k=1)
    real, calls, returned, late = os.pwrite, [0], threading.Event(), []
    lock = threading.Lock()

    def failing(fd, data, offset):
        with lock:
            calls[0] += 1
            nth = calls[0]
        if nth == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        if nth > 3:
            time.sleep(0.3)  # a run still writing when the failure is raised
        if returned.is_set():
            late.append(offset)
        return real(fd, data, offset)

    monkeypatch.setattr(checkpoint.os, "pwrite", failing)
    with pytest.raises(CheckpointError, match="could not write segment 1.*No space left"):
        write_segment(tmp_path, 1, _state(), {}, job_id="j", recipe="r", step=1, k=1)
    returned.set()
    time.sleep(1.0)  # longer than a straggling run's write: it would have written by now
    assert late == []
    assert calls[0] >= 3
    assert kept_indices(tmp_path) == [0]
    assert not segment_dir(tmp_path, 1).exists() and not (tmp_path / "segments" / ".00000001.tmp").exists()
    assert torch.equal(read_segment(segment_dir(tmp_path, 0)).state.weights["w5"], _state().weights["w5"])

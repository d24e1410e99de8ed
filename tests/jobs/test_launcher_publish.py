"""What node 0's launcher publishes into a synced folder on an object-store mount (jobs/launcher_publish.py), the
folder watched as Cloud Storage FUSE would be (clouds/object_mount.py: uploads on close, directory renames
refused): closed files only, each segment's manifest after its files, no directory renamed, files the job removed
removed, and the log as closed parts named by their byte offset."""

from __future__ import annotations

import os
import time

from clouds import checked
from clouds.object_mount import ObjectMount
from trainmaster.jobs.launcher_publish import LogParts, Publisher, restore


def _mount(sync):
    sync.mkdir(parents=True, exist_ok=True)
    store: dict[str, bytes] = {}
    mount = ObjectMount(sync, upload=lambda rel, path: store.__setitem__(rel, path.read_bytes()),
                        delete=lambda rel: store.pop(rel, None), service="vertex")
    return mount, store


def test_segments_and_files_reach_the_store_whole_without_a_directory_rename(tmp_path):
    local, sync = tmp_path / "local", tmp_path / "sync"
    mount, store = _mount(sync)
    start = checked.mark()
    try:
        segment = local / "checkpoints" / "segments" / ".00000000.tmp"
        segment.mkdir(parents=True)
        (segment / "weights.safetensors").write_bytes(b"w" * 1000)
        (segment / "manifest.json").write_text('{"step": 25}')
        os.replace(segment, segment.with_name("00000000"))  # the runtime's own rename, on the local disk
        (local / "outputs").mkdir()
        (local / "outputs" / "metrics.jsonl").write_text('{"step": 1}\n')
        (local / "outputs" / ".result.json.abc.tmp").write_text("half")  # an atomic write in progress
        publisher = Publisher(local, sync, ("outputs", "checkpoints"), interval_s=0.05).start()
        publisher.log.write(b"hello\n")
        time.sleep(0.5)
        mount.settle()
        assert store["checkpoints/segments/00000000/manifest.json"] == b'{"step": 25}'
        assert store["checkpoints/segments/00000000/weights.safetensors"] == b"w" * 1000
        assert store["outputs/metrics.jsonl"] == b'{"step": 1}\n'
        assert not any(".tmp" in key for key in store)  # files still being written wait
        assert store["log/0000000000000000.log"] == b"hello\n"  # visible while the job runs
        with open(local / "outputs" / "metrics.jsonl", "a") as handle:  # the runtime's held-open append...
            handle.write('{"step": 2}\n')
            handle.flush()
            time.sleep(0.4)
            mount.settle()
            assert store["outputs/metrics.jsonl"] == b'{"step": 1}\n{"step": 2}\n'  # ...copied whole, closed
        (local / "outputs" / "metrics.jsonl").unlink()
        publisher.finish()
        mount.settle()
        assert "outputs/metrics.jsonl" not in store  # removed by the job: removed from the synced folder
        assert store["outputs/.result.json.abc.tmp"] == b"half"  # at the end every regular file goes
    finally:
        mount.close()
    assert checked.since(start) == []  # no directory renamed on the mount


def test_a_manifest_is_copied_after_its_segments_files(tmp_path, monkeypatch):
    import shutil

    order = []
    copy = shutil.copyfile
    monkeypatch.setattr(shutil, "copyfile", lambda a, b, **kw: order.append(os.path.basename(b)) or copy(a, b, **kw))
    local = tmp_path / "local"
    segment = local / "checkpoints" / "segments" / "00000003"
    segment.mkdir(parents=True)
    for name in ("manifest.json", "decisions.safetensors", "rest.safetensors", "weights.safetensors"):
        (segment / name).write_bytes(name.encode())
    Publisher(local, tmp_path / "sync", ("checkpoints",)).publish(final=False)
    assert order[-1] == "manifest.json" and len(order) == 4


def test_the_log_is_closed_parts_named_by_offset(tmp_path):
    parts = LogParts(tmp_path / "log", part_bytes=10, part_s=3600)
    parts.write(b"0123456")
    parts.flush()
    parts.write(b"789ab")  # the first part now holds 12 bytes: full, so the next one starts at 12
    parts.flush()
    parts.write(b"cd")
    parts.flush()
    found = {p.name: p.read_bytes() for p in sorted((tmp_path / "log").iterdir())}
    assert found == {"0000000000000000.log": b"0123456789ab", "0000000000000012.log": b"cd"}
    again = LogParts(tmp_path / "log")  # a launcher restarted by the service goes on after it
    assert again.start == 14


def test_restore_brings_the_synced_checkpoints_back_to_the_local_folder(tmp_path):
    sync, local = tmp_path / "sync", tmp_path / "local"
    (sync / "checkpoints" / "segments" / "00000001").mkdir(parents=True)
    (sync / "checkpoints" / "segments" / "00000001" / "manifest.json").write_text("{}")
    (sync / "checkpoints" / ".partial").write_text("x")
    restore(sync, local, ("checkpoints", "outputs"))
    assert (local / "checkpoints" / "segments" / "00000001" / "manifest.json").read_text() == "{}"
    assert not (local / "checkpoints" / ".partial").exists()

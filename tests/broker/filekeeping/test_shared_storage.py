"""Shared storage in a folder every host mounts (TRAINMASTER_SHARED_STORAGE=/abs/dir), end to end through the CLI:
a local job's bundle and accepted outputs are put there, `status` says where, and a second host (simulated: the
home's bundle cache and outputs folder deleted) gets them back from there with every sha256 checked; altered bytes
there are refused with the reason. Unset, everything stays in the home as before."""

from __future__ import annotations

import hashlib
import json

import pytest

from shared_support import FAILS_FIRST, TWO_OUTPUTS, cli, files_under, submitted


@pytest.fixture
def shared(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    return root


def _second_host(home, job):
    """What a host that did not run the job lacks: its bundle cache and its outputs folder."""
    for path in (home / "bundles", home / "jobs" / job["id"] / "outputs"):
        for found in sorted(path.rglob("*"), reverse=True):
            found.unlink() if found.is_file() else found.rmdir()
        path.rmdir()


def test_bundle_and_outputs_are_put_in_the_folder_and_restored_from_it(job_factory, tm_home, shared, tmp_path):
    job = submitted(job_factory(TWO_OUTPUTS), tm_home, str(shared))
    assert job["state"] == "accepted"
    bundle = shared / "bundles" / f"{job['bundle_sha256']}.tar"
    assert hashlib.sha256(bundle.read_bytes()).hexdigest() == job["bundle_sha256"]
    kept = files_under(tm_home / "jobs" / job["id"] / "outputs")
    assert set(kept) == {"result.txt", "sub/weights.bin"}
    assert files_under(shared / "jobs" / job["id"] / "outputs") == kept
    manifest = json.loads((shared / "jobs" / job["id"] / "manifest.json").read_text())
    assert {(f["path"], f["sha256"]) for f in manifest["files"]} == {
        (p, hashlib.sha256(data).hexdigest()) for p, data in kept.items()}

    status = json.loads(cli("status", job["id"], "--json", home=tm_home, storage=None).stdout)
    assert status["outputs_url"] == str(shared / "jobs" / job["id"] / "outputs")  # recorded: no setting needed
    shown = cli("status", job["id"], home=tm_home, storage=None).stdout
    assert f"shared outputs: {shared}/jobs/{job['id']}/outputs" in shown

    _second_host(tm_home, job)
    dest = tmp_path / "restored"
    got = cli("outputs", job["id"][:-3], "--dest", str(dest), "--json", home=tm_home, storage=None)
    assert got.returncode == 0, got.stderr
    assert files_under(dest) == kept
    assert json.loads(got.stdout)["from"] == str(shared)


def test_an_altered_shared_output_is_refused_with_the_reason(job_factory, tm_home, shared, tmp_path):
    job = submitted(job_factory(TWO_OUTPUTS), tm_home, str(shared))
    altered = shared / "jobs" / job["id"] / "outputs" / "result.txt"
    altered.write_text("no")  # as many bytes: only the hash tells
    got = cli("outputs", job["id"], "--dest", str(tmp_path / "d"), home=tm_home, storage=str(shared))
    assert got.returncode == 2
    assert f"{altered} is not the output that was accepted" in " ".join(got.stderr.split())
    assert not (tmp_path / "d" / "result.txt").exists()
    altered.write_text("longer")
    got = cli("outputs", job["id"], "--dest", str(tmp_path / "d"), home=tm_home, storage=str(shared))
    assert got.returncode == 2 and "holds 6 bytes, not the 2 recorded" in " ".join(got.stderr.split())


def test_a_dispatch_fetches_the_bundle_from_the_folder_checked(job_factory, tm_home, shared, tmp_path):
    mark = tmp_path / "mark"
    spec = job_factory(FAILS_FIRST, f"env: {{MARK: {mark}}}\n")
    job = submitted(spec, tm_home, str(shared))
    assert job["state"] == "failed"
    cache = tm_home / "bundles" / f"{job['bundle_sha256']}.tar"
    kept = shared / "bundles" / cache.name
    original = kept.read_bytes()

    cache.unlink()
    kept.write_bytes(original + b"altered")
    refused = cli("resume", job["id"], home=tm_home, storage=str(shared))
    assert refused.returncode == 2
    assert f"{kept} is not the bundle it names, so it is not used" in " ".join(refused.stderr.split())
    assert not cache.exists()

    kept.write_bytes(original)  # fixed: the waiting attempt starts on the next command's pass
    assert cli("logs", "-f", job["id"], home=tm_home, storage=str(shared)).returncode == 0
    status = json.loads(cli("status", job["id"], "--json", home=tm_home, storage=str(shared)).stdout)
    assert status["state"] == "accepted"
    assert cache.read_bytes() == original


def test_a_bundle_already_there_is_not_sent_again(job_factory, tm_home, shared):
    spec = job_factory(TWO_OUTPUTS)
    first = submitted(spec, tm_home, str(shared))
    bundle = shared / "bundles" / f"{first['bundle_sha256']}.tar"
    before = bundle.stat()
    second = submitted(spec, tm_home, str(shared))
    assert second["bundle_sha256"] == first["bundle_sha256"] and second["id"] != first["id"]
    assert (bundle.stat().st_ino, bundle.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(p.name for p in (shared / "bundles").iterdir()) == [bundle.name]


def test_unset_everything_stays_in_the_home_and_outputs_come_from_there(job_factory, tm_home, tmp_path):
    job = submitted(job_factory(TWO_OUTPUTS), tm_home, None)
    assert job["state"] == "accepted" and job["outputs_url"] is None
    assert not any(e["kind"] == "shared" for e in json.loads(
        cli("status", job["id"], "--json", home=tm_home, storage=None).stdout)["events"])
    dest = tmp_path / "here"
    got = cli("outputs", job["id"], "--dest", str(dest), home=tm_home, storage=None)
    assert got.returncode == 0, got.stderr
    assert files_under(dest) == files_under(tm_home / "jobs" / job["id"] / "outputs")
    (tm_home / "jobs" / job["id"] / "outputs" / "result.txt").write_text("no")
    refused = cli("outputs", job["id"], "--dest", str(tmp_path / "again"), home=tm_home, storage=None)
    assert refused.returncode == 2 and "is not the output that was accepted" in refused.stderr


def test_a_job_not_accepted_has_no_outputs_to_download(job_factory, tm_home, tmp_path):
    job = submitted(job_factory("import sys\nsys.exit(1)\n"), tm_home, None)
    got = cli("outputs", job["id"], home=tm_home, storage=None)
    assert got.returncode == 1 and "is failed: only an accepted job's outputs are kept" in got.stderr


def test_postgresql_without_shared_storage_refuses_to_bundle(job_factory, tm_home, postgres_url):
    got = cli("submit", str(job_factory(TWO_OUTPUTS)), home=tm_home, storage=None,
              TRAINMASTER_DATABASE_URL=postgres_url)  # a real server: the state opens, the bundle is refused
    assert got.returncode == 2
    said = " ".join(got.stderr.split())
    assert "TRAINMASTER_DATABASE_URL names a PostgreSQL server" in said and "TRAINMASTER_SHARED_STORAGE is not set" in said
    assert not (tm_home / "bundles").exists() or not any((tm_home / "bundles").iterdir())


@pytest.mark.parametrize("value", ["relative/dir", "ftp://host/x", "s3://"])
def test_a_setting_that_names_no_storage_is_refused(job_factory, tm_home, value):
    got = cli("submit", str(job_factory(TWO_OUTPUTS)), home=tm_home, storage=value)
    assert got.returncode == 2 and f"TRAINMASTER_SHARED_STORAGE={value}" in got.stderr


def test_the_promotion_on_another_host_gets_the_outputs_back_from_the_folder(job_factory, tm_home, shared):
    from trainmaster.broker import paths
    from trainmaster.broker.filekeeping.shared_outputs import restore_home
    from trainmaster.broker.filekeeping.shared_storage import SharedStorageError
    from trainmaster.broker.store import Store

    job = submitted(job_factory(TWO_OUTPUTS), tm_home, str(shared))
    outputs = tm_home / "jobs" / job["id"] / "outputs"
    kept = files_under(outputs)
    _second_host(tm_home, job)
    store = Store(paths.state_db())
    try:
        restore_home(store, job["id"], job["attempts"][-1]["id"])  # what the promotion hook does first
        assert files_under(outputs) == kept
        (outputs / "result.txt").unlink()
        (shared / "jobs" / job["id"] / "outputs" / "result.txt").write_text("no")
        with pytest.raises(SharedStorageError, match="is not the output that was accepted"):
            restore_home(store, job["id"], job["attempts"][-1]["id"])
        assert not (outputs / "result.txt").exists()
    finally:
        store.close()

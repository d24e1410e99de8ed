"""A test-side runner that plays Vertex AI for the CustomJobs FakeVertex holds (FakeVertex never runs anything).

For each new PENDING job it does what Vertex would: it mounts the bucket (a temp folder as `/gcs`, named by
TRAINMASTER_GCS_MOUNT, holding what the job reads: the bundle and what the attempt's `checkpoints/` already
holds), sets AIP_CHECKPOINT_DIR / AIP_MODEL_DIR under the job's base output directory and, for several
replicas, CLUSTER_SPEC (workerpool0 at 127.0.0.1, workerpool1 at localhost), starts one
`python -m trainmaster.jobs.launcher` per replica with the job's container env, mirrors the attempt's folders
from the mount to the bucket every 0.2 s and once more at the end (what the FUSE mount does; files renamed away
are deleted), and sets the job's state: RUNNING, then SUCCEEDED or FAILED with the exit code in the error
(Vertex's words), run time as the billable time. It can preempt (kill the replicas once a checkpoint segment is
written, then FAILED with a preemption error) and it stops the replicas of a job being cancelled (then CANCELLED).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from clouds.gcp_server import BUCKET

MIRROR_S = 0.2
PREEMPTED = "The job was preempted: a Spot VM of workerpool0 was reclaimed by Compute Engine."


class VertexRunner:
    def __init__(self, servers, root: Path, env: dict[str, str]):
        self.servers, self.fake, self.root, self.env = servers, servers.vertex, root, env
        self.preempt = 0
        """How many of the next jobs to preempt, each once its synced folder holds a checkpoint segment."""
        self.played: dict[str, list[int]] = {}
        """Job resource name -> its replicas' exit codes (empty while they run, or when preempted)."""
        self.cluster_specs: list[dict] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._bucket = servers.storage_client().bucket(BUCKET)
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="vertex-runner")
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        self._watcher.join(10)
        for thread in self._threads:
            thread.join(30)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for name, job in list(self.fake.jobs.items()):
                if name not in self.played and job.state.name == "JOB_STATE_PENDING":
                    self.played[name] = []
                    thread = threading.Thread(target=self._play, args=(name,), daemon=True)
                    self._threads.append(thread)
                    thread.start()
            self._stop.wait(0.1)

    def _play(self, name: str) -> None:
        job = self.fake.jobs[name]
        pools = job.job_spec.worker_pool_specs
        container = pools[0].container_spec
        env = {e.name: e.value for e in container.env}
        base = job.job_spec.base_output_directory.output_uri_prefix
        folder = self.root / name.rsplit("/", 1)[1]
        mount = folder / "gcs"
        self._pull(json.loads(env["TRAINMASTER_LAUNCH"])["bundle"], mount)
        for blob in self._bucket.client.list_blobs(self._bucket, prefix=_key(base + "checkpoints/")):
            self._pull(f"gs://{self._bucket.name}/{blob.name}", mount)
        replicas = sum(p.replica_count for p in pools)
        self.fake.set_state(name, "JOB_STATE_RUNNING")
        procs = [self._start(container, env, base, mount, folder, rank, replicas) for rank in range(replicas)]
        preempt = self.preempt > 0
        if preempt:
            self.preempt -= 1
        mirror = _Mirror(self._bucket, mount, base)
        while any(p.poll() is None for p in procs):
            mirror.once()
            if self.fake.jobs[name].state.name == "JOB_STATE_CANCELLING":
                _signal(procs, signal.SIGTERM)
                _wait(procs)
                mirror.once()
                self.fake.set_state(name, "JOB_STATE_CANCELLED")
                return
            if preempt and mirror.has_segment():  # Vertex: SIGTERM, then the VM is gone
                _signal(procs, signal.SIGTERM)
                _wait(procs)
                mirror.once()
                self.fake.set_state(name, "JOB_STATE_FAILED", error=PREEMPTED, code=14)
                return
            time.sleep(MIRROR_S)
        mirror.once()
        codes = [p.returncode for p in procs]
        self.played[name] = codes
        failed = next(((rank, code) for rank, code in enumerate(codes) if code), None)
        if failed is None:
            self.fake.set_state(name, "JOB_STATE_SUCCEEDED")
        else:
            pool = "workerpool0-0" if failed[0] == 0 else f"workerpool1-{failed[0] - 1}"
            self.fake.set_state(name, "JOB_STATE_FAILED", code=13,
                                error=f"The replica {pool} exited with a non-zero status of {failed[1]}.")

    def _start(self, container, env: dict, base: str, mount: Path, folder: Path, rank: int, replicas: int):
        service = {"TRAINMASTER_GCS_MOUNT": str(mount), "AIP_CHECKPOINT_DIR": base + "checkpoints/",
                   "AIP_MODEL_DIR": base + "model/"}
        if replicas > 1:
            port = _free_port() if rank == 0 else None
            spec = self._cluster(replicas, port, rank)
            service["CLUSTER_SPEC"] = json.dumps(spec)
        scratch = folder / f"replica{rank}"
        scratch.mkdir(parents=True, exist_ok=True)
        command = [sys.executable if arg == "python" else arg for arg in container.command]
        with open(folder / f"replica{rank}.log", "wb") as out:
            return subprocess.Popen(command, env={**self.env, **env, **service, "TMPDIR": str(scratch)},
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _cluster(self, replicas: int, port: int | None, rank: int) -> dict:
        """CLUSTER_SPEC as Vertex sets it: the same cluster on every replica, this replica's task."""
        if rank == 0:
            self._port = port
        cluster = {"workerpool0": [f"127.0.0.1:{self._port}"],
                   "workerpool1": [f"localhost:{self._port}" for _ in range(replicas - 1)]}
        task = {"type": "workerpool0", "index": 0} if rank == 0 else {"type": "workerpool1", "index": rank - 1}
        spec = {"cluster": cluster, "environment": "cloud", "task": task}
        self.cluster_specs.append(spec)
        return spec

    def _pull(self, uri: str, mount: Path) -> None:
        target = mount / uri.removeprefix("gs://")
        target.parent.mkdir(parents=True, exist_ok=True)
        self._bucket.blob(_key(uri)).download_to_filename(str(target))


class _Mirror:
    """The job's folders under the mount, copied to the bucket as they change (the FUSE mount's writes)."""

    def __init__(self, bucket, mount: Path, base: str):
        self.bucket, self.root, self.local = bucket, mount / bucket.name, mount / base.removeprefix("gs://")
        self.seen: dict[Path, tuple[int, int]] = {}

    def once(self) -> None:
        """Upload what changed, delete what is gone (a temp file renamed, say), as gcsfuse does."""
        here = set()
        for path in sorted(p for p in self.local.rglob("*") if p.is_file()):
            try:
                stat = path.stat()
                if self.seen.get(path) != (stat.st_size, stat.st_mtime_ns):
                    self._blob(path).upload_from_filename(str(path))
                    self.seen[path] = (stat.st_size, stat.st_mtime_ns)
            except FileNotFoundError:  # renamed away while we looked: deleted below
                continue
            here.add(path)
        for gone in set(self.seen) - here:
            del self.seen[gone]
            self._blob(gone).delete()

    def _blob(self, path: Path):
        return self.bucket.blob(str(path.relative_to(self.root)))

    def has_segment(self) -> bool:
        return any(self.local.glob("checkpoints/checkpoints/segments/*/manifest.json"))


def _key(uri: str) -> str:
    """The object name of gs://bucket/name."""
    return uri.removeprefix("gs://").split("/", 1)[1]


def _signal(procs, sig) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass


def _wait(procs) -> None:
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            _signal([proc], signal.SIGKILL)
            proc.wait(10)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

"""A test-side runner that plays Vertex AI for the CustomJobs FakeVertex holds (FakeVertex never runs anything).

For each new PENDING job it does what Vertex does, and nothing more: it pulls the image (only the test image,
clouds/container.py; another fails the job as an image Vertex cannot pull), mounts the staging bucket as
Cloud Storage FUSE does (a local folder standing for /gcs/<bucket>: every object of the staging prefix but other
attempts' folders is there when the container starts; the attempt's folder behaves as the mount does,
clouds/object_mount.py: a file reaches the bucket when it is closed, a directory rename is refused), and starts
the container's command as given, once per replica, with the image's base environment, the container's `env`,
AIP_MODEL_DIR, AIP_CHECKPOINT_DIR, AIP_TENSORBOARD_LOG_DIR (gs:// URIs under the job's base output directory)
and, for several replicas, CLUSTER_SPEC (workerpool0 at 127.0.0.1, workerpool1 at localhost). /gcs cannot be
made on this machine, so the mount's folder is elsewhere: the command's /gcs/ paths are rewritten to it and the
launcher is told with TRAINMASTER_GCS_MOUNT (the one relocation; the launcher knows /gcs as the default).

It sets the job's state: RUNNING, then SUCCEEDED or FAILED with the exit code in the error (Vertex's words), run
time as the billable time. It can preempt (once a checkpoint segment is on a replica's disk: frozen, synced to the
bucket, SIGTERM, then FAILED with a preemption error; clouds/reclaim.py) and it stops the replicas of a job being
cancelled (then CANCELLED).
`started` records, per job, when its first container started (the benchmark's submit-to-start time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from clouds import reclaim
from clouds.container import IMAGE
from clouds.gcp_server import BUCKET
from clouds.object_mount import ObjectMount

PREEMPTED = "The job was preempted: a Spot VM of workerpool0 was reclaimed by Compute Engine."
POLL_S = 0.2


class VertexRunner:
    def __init__(self, servers, root: Path, container):
        self.servers, self.fake, self.root, self.container = servers, servers.vertex, root, container
        self.preempt = 0
        """How many of the next jobs to preempt, each once its synced folder holds a checkpoint segment."""
        self.played: dict[str, list[int]] = {}
        """Job resource name -> its replicas' exit codes (empty while they run, or when preempted)."""
        self.cluster_specs: list[dict] = []
        self.started: dict[str, float] = {}
        self.mounts: dict[str, ObjectMount] = {}
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
        if container.image_uri != IMAGE:
            self.fake.set_state(name, "JOB_STATE_FAILED", code=5, error=f"Unable to pull the image {container.image_uri}")
            return
        env = {e.name: e.value for e in container.env}
        base = job.job_spec.base_output_directory.output_uri_prefix
        folder = self.root / name.rsplit("/", 1)[1]
        mount = folder / "gcs"
        attempt = _key(base)
        self._pull(attempt, mount)
        local = mount / BUCKET / attempt
        local.mkdir(parents=True, exist_ok=True)
        fuse = self.mounts[name] = ObjectMount(
            local, upload=lambda rel, path: self._bucket.blob(attempt + rel).upload_from_filename(str(path)),
            delete=lambda rel: _delete(self._bucket, attempt + rel), service="vertex")
        replicas = sum(p.replica_count for p in pools)
        self.fake.set_state(name, "JOB_STATE_RUNNING")
        self.started.setdefault(name, time.time())
        procs = [self._start(container, env, base, mount, folder, rank, replicas) for rank in range(replicas)]
        preempt = self.preempt > 0
        if preempt:
            self.preempt -= 1
        try:
            while any(p.poll() is None for p in procs):
                if self.fake.jobs[name].state.name == "JOB_STATE_CANCELLING":
                    _signal(procs, signal.SIGTERM)
                    _wait(procs)
                    fuse.settle()
                    self.fake.set_state(name, "JOB_STATE_CANCELLED")
                    return
                if preempt and reclaim.segment_on_disk(local / "checkpoints" / "checkpoints"):
                    frozen = reclaim.freeze(procs)  # the VM is being reclaimed: nothing more is written
                    fuse.settle()  # the segment reaches the bucket
                    _signal(procs, signal.SIGTERM)  # Vertex: SIGTERM, then the VM is gone
                    reclaim.thaw(frozen)
                    _wait(procs)
                    fuse.settle()
                    self.fake.set_state(name, "JOB_STATE_FAILED", error=PREEMPTED, code=14)
                    return
                time.sleep(reclaim.POLL_S if preempt else POLL_S)
            fuse.settle()
        finally:
            fuse.close()
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
        service = {"AIP_CHECKPOINT_DIR": base + "checkpoints/", "AIP_MODEL_DIR": base + "model/",
                   "AIP_TENSORBOARD_LOG_DIR": base + "logs/", "TRAINMASTER_GCS_MOUNT": str(mount)}
        if replicas > 1:
            service["CLUSTER_SPEC"] = json.dumps(self._cluster(replicas, rank))
        base_env = self.container.env(folder / f"replica{rank}")
        argv = [arg.replace("/gcs/", f"{mount}/", 1) if arg.startswith("/gcs/") else arg
                for arg in self.container.argv(list(container.command) + list(container.args))]
        with open(folder / f"replica{rank}.log", "wb") as out:
            return subprocess.Popen(argv, env={**base_env, **env, **service}, cwd=folder / f"replica{rank}",
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _cluster(self, replicas: int, rank: int) -> dict:
        """CLUSTER_SPEC as Vertex sets it: the same cluster on every replica, this replica's task."""
        if rank == 0:
            self._port = _free_port()
        cluster = {"workerpool0": [f"127.0.0.1:{self._port}"],
                   "workerpool1": [f"localhost:{self._port}" for _ in range(replicas - 1)]}
        task = {"type": "workerpool0", "index": 0} if rank == 0 else {"type": "workerpool1", "index": rank - 1}
        spec = {"cluster": cluster, "environment": "cloud", "task": task}
        self.cluster_specs.append(spec)
        return spec

    def _pull(self, attempt: str, mount: Path) -> None:
        """What the mount shows when the container starts: the staging prefix, other attempts' folders left out."""
        staging = attempt.split("attempts/", 1)[0]
        for blob in self._bucket.client.list_blobs(self._bucket, prefix=staging):
            rest = blob.name[len(staging):]
            if rest.startswith("attempts/") and not blob.name.startswith(attempt):
                continue
            target = mount / BUCKET / blob.name
            target.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(target))


def _key(uri: str) -> str:
    """The object name of gs://bucket/name."""
    return uri.removeprefix("gs://").split("/", 1)[1]


def _delete(bucket, name: str) -> None:
    from google.api_core import exceptions

    try:
        bucket.blob(name).delete()
    except exceptions.NotFound:
        pass


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

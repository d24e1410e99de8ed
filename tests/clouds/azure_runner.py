"""Plays Azure ML for the tests: each job the fake holds, once created, runs as Azure ML would run it.

For every new job it downloads the `bundle` input from Azurite (AZURE_ML_INPUT_bundle), mounts the `sync`
output as a local folder (its blobs restored first, as a mount shows them; AZURE_ML_OUTPUT_sync) mirrored back
to Azurite every 0.2 s and once more at the end, and starts `python -m trainmaster.jobs.launcher` once per
instance (NODE_RANK, MASTER_ADDR, MASTER_PORT of its PyTorch distribution) with the job's variables and the
test's PYTHONPATH. It sets the job's status (Running, then Completed or Failed with the exit code, start and end
times), stops it when cancelled, and can preempt a spot job (kill its instances) once its synced folder holds a
given checkpoint segment. Refusing capacity and throttling are the fake's `faults`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from clouds.azure_server import AzureServers

MIRROR_S = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AzureMLRunner:
    def __init__(self, servers: AzureServers, workdir: Path):
        from azure.storage.blob import BlobServiceClient

        self.servers, self.workdir = servers, workdir
        self.blobs = BlobServiceClient.from_connection_string(servers.azurite.connection_string)
        self.played: dict[str, threading.Thread] = {}
        self.preempt_at_segment: int | None = None
        """Preempt the next spot job once its synced folder holds this checkpoint segment (then cleared)."""
        self.exit_codes: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watch_jobs, daemon=True, name="azureml-runner")

    def __enter__(self) -> AzureMLRunner:
        self._watch.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._watch.join(10)
        for thread in self.played.values():
            thread.join(30)

    def _watch_jobs(self) -> None:
        while not self._stop.is_set():
            for name, job in list(self.servers.fake.jobs.items()):
                if name not in self.played and job["properties"]["status"] == "NotStarted":
                    self.played[name] = threading.Thread(target=self._play, args=(name,), daemon=True)
                    self.played[name].start()
            time.sleep(0.05)

    def _blob_path(self, url: str) -> tuple[str, str]:
        """(container, blob name) of an Azurite blob URL."""
        container, _, name = url[len(self.servers.azurite.url) + 1:].partition("/")
        return container, name

    def _play(self, name: str) -> None:
        fake, props = self.servers.fake, self.servers.fake.properties(name)
        root = self.workdir / name
        sync = root / "sync"
        sync.mkdir(parents=True)
        bundle = root / "inputs" / "bundle.tar"
        bundle.parent.mkdir()
        container, key = self._blob_path(props["inputs"]["bundle"]["uri"])
        bundle.write_bytes(self.blobs.get_blob_client(container, key).download_blob().readall())
        sync_container, sync_prefix = self._blob_path(props["outputs"]["sync"]["uri"])
        mirror = Mirror(self.blobs.get_container_client(sync_container), sync_prefix, sync)
        mirror.restore()
        fake.set_status(name, "Running", start=time.time())
        procs = self._start(props, bundle, sync, root)
        preempt_at, spot = self.preempt_at_segment, props["queueSettings"]["jobTier"] == "Spot"
        outcome = None
        while outcome is None:
            time.sleep(MIRROR_S)
            mirror.push()
            if props["status"] == "CancelRequested":
                outcome = "Canceled"
            elif spot and preempt_at is not None and (sync / "checkpoints" / "segments" / f"{preempt_at:08d}" /
                                                      "manifest.json").exists():
                self.preempt_at_segment, outcome = None, "Preempted"
            elif all(p.poll() is not None for p in procs):
                outcome = "Ended"
        if outcome != "Ended":
            for p in procs:
                p.kill()
        codes = [p.wait() for p in procs]
        self.exit_codes[name] = codes
        if outcome != "Preempted":  # a preempted node's last writes never reach the store
            mirror.push()
        end = time.time()
        if outcome == "Canceled":
            fake.set_status(name, "Canceled", end=end)
        elif outcome == "Preempted":
            fake.set_status(name, "Failed", error="The low priority node was preempted (spot eviction)", end=end)
        elif any(codes):
            fake.set_status(name, "Failed", error=f"Execution failed. User process 'python' exited with status "
                                                   f"code {next(c for c in codes if c)}.", end=end)
        else:
            fake.set_status(name, "Completed", end=end)

    def _start(self, props: dict, bundle: Path, sync: Path, root: Path) -> list[subprocess.Popen]:
        count, port = props["resources"]["instanceCount"], free_port()
        procs = []
        for rank in range(count):
            env = {**os.environ, **props["environmentVariables"], "AZURE_ML_INPUT_bundle": str(bundle),
                   "AZURE_ML_OUTPUT_sync": str(sync)}
            if "distribution" in props:
                env.update(NODE_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            node = root / f"node{rank}"
            node.mkdir()
            with open(root / f"node{rank}.log", "wb") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "trainmaster.jobs.launcher"], env=env, cwd=node,
                                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        return procs


class Mirror:
    """A local folder kept in step with a blob prefix, as Azure ML's read-write mount keeps it."""

    def __init__(self, container, prefix: str, folder: Path):
        self.container, self.prefix, self.folder = container, prefix, folder
        self.sent: dict[str, tuple[int, int]] = {}

    def restore(self) -> None:
        for blob in self.container.list_blobs(name_starts_with=self.prefix):
            path = self.folder / blob.name[len(self.prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(self.container.get_blob_client(blob.name).download_blob().readall())
            self.sent[str(path)] = (path.stat().st_size, path.stat().st_mtime_ns)

    def push(self) -> None:
        for path in sorted(self.folder.rglob("*")):
            try:
                stamp = (path.stat().st_size, path.stat().st_mtime_ns)
                if not path.is_file() or self.sent.get(str(path)) == stamp:
                    continue
                data = path.read_bytes()
            except FileNotFoundError:  # replaced while listed: the next push sends it
                continue
            key = self.prefix + path.relative_to(self.folder).as_posix()
            self.container.get_blob_client(key).upload_blob(data, overwrite=True)
            self.sent[str(path)] = stamp

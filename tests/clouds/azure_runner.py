"""Plays Azure ML for the tests: each job the fake holds, once created, runs as Azure ML would run it.

For every new job it does what the service does, and nothing more: it pulls the job's environment image (only the
test image, clouds/container.py; another fails the job), resolves the job's datastore URIs through the
workspace's datastores (azureml://datastores/<name>/paths/<path> → that datastore's Azurite container),
downloads the `download` inputs (AZURE_ML_INPUT_<name>), mounts the `rw_mount` outputs (AZURE_ML_OUTPUT_<name>:
a local folder showing the blobs already there, whose files reach Azurite when they are closed,
clouds/object_mount.py), and runs the job's own `command` with bash, as written, its ${{inputs.<name>}} and
${{outputs.<name>}} replaced by those paths, once per instance, with the image's base environment, the job's
environment variables and, under a PyTorch distribution, MASTER_ADDR, MASTER_PORT, NODE_RANK, WORLD_SIZE and
RANK (one process per instance). It moves the job's status as the service does (Queued, Running, then
Completed, Failed or Canceled; systemData.lastModifiedAt moving with each), stops it when cancelled, and can
preempt a spot job once a given checkpoint segment is on its synced folder's disk (frozen, synced to the store,
killed: clouds/reclaim.py), or reclaim one after its processes exited, while the service still finalizes it (its
outputs synced, the job then Failed, with no error text, as a spot VM taken back at that moment leaves it).
Refusing capacity and throttling are the fake's `faults`. `started` records, per job, when its first instance
started (the benchmark's submit-to-start time).
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from pathlib import Path

from clouds import reclaim
from clouds.azure_server import AzureServers
from clouds.container import IMAGE
from clouds.object_mount import ObjectMount

POLL_S = 0.2
DATASTORE = re.compile(r"azureml://datastores/(?P<name>[^/]+)/paths/(?P<path>.+)")
BINDING = re.compile(r"\$\{\{(inputs|outputs)\.([A-Za-z0-9_]+)\}\}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AzureMLRunner:
    def __init__(self, servers: AzureServers, workdir: Path, container):
        from azure.storage.blob import BlobServiceClient

        self.servers, self.workdir, self.container = servers, workdir, container
        self.blobs = BlobServiceClient.from_connection_string(servers.azurite.connection_string)
        self.played: dict[str, threading.Thread] = {}
        self.preempt_at_segment: int | None = None
        """Preempt the next spot job once its synced folder holds this checkpoint segment (then cleared)."""
        self.reclaim_after_exit = False
        """Reclaim the next spot job after its processes exited, before the service completes it (then cleared)."""
        self.exit_codes: dict[str, list[int]] = {}
        self.started: dict[str, float] = {}
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

    def _container_of(self, uri: str):
        """(container client, blob path) of a datastore URI."""
        match = DATASTORE.fullmatch(uri)
        container = self.servers.fake.datastores[match["name"]]
        return self.blobs.get_container_client(container), match["path"]

    def _download(self, uri: str, target: Path, kind: str) -> Path:
        client, path = self._container_of(uri)
        if kind == "uri_file":
            target.mkdir(parents=True, exist_ok=True)
            local = target / path.rsplit("/", 1)[-1]
            local.write_bytes(client.get_blob_client(path).download_blob().readall())
            return local
        prefix = path.rstrip("/") + "/"
        for blob in client.list_blobs(name_starts_with=prefix):
            local = target / blob.name[len(prefix):]
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(client.get_blob_client(blob.name).download_blob().readall())
        target.mkdir(parents=True, exist_ok=True)
        return target

    def _play(self, name: str) -> None:
        fake, props = self.servers.fake, self.servers.fake.properties(name)
        if fake.image(name) != IMAGE:
            fake.set_status(name, "Failed")  # the image cannot be pulled
            return
        root = self.workdir / name
        paths, mounts = {}, []
        fake.set_status(name, "Queued")
        for input_name, given in props.get("inputs", {}).items():
            paths[("inputs", input_name)] = self._download(given["uri"], root / "inputs" / input_name,
                                                           given["jobInputType"])
        for output_name, given in props.get("outputs", {}).items():
            local = self._download(given["uri"], root / "outputs" / output_name, "uri_folder")
            client, path = self._container_of(given["uri"])
            prefix = path.rstrip("/") + "/"
            mounts.append(ObjectMount(
                local, upload=lambda rel, file, c=client, p=prefix: c.get_blob_client(p + rel).upload_blob(
                    file.read_bytes(), overwrite=True),
                delete=lambda rel, c=client, p=prefix: _delete(c, p + rel), service="azureml", rename_dirs=True))
            paths[("outputs", output_name)] = local
        fake.set_status(name, "Running")
        self.started.setdefault(name, time.time())
        procs = self._start(props, paths, root)
        preempt_at, spot = self.preempt_at_segment, (props.get("queueSettings") or {}).get("jobTier") == "Spot"
        outcome, frozen, armed = None, [], spot and preempt_at is not None
        reclaimed = spot and self.reclaim_after_exit
        while outcome is None:
            time.sleep(reclaim.POLL_S if armed else POLL_S)
            if props["status"] == "CancelRequested":
                outcome = "Canceled"
            elif armed and reclaim.segment_on_disk(paths[("outputs", "sync")] / "checkpoints", preempt_at):
                frozen = reclaim.freeze(procs)  # the VM is being reclaimed: nothing more is written (reclaim.py)
                for mount in mounts:
                    mount.settle()  # the segment reaches the store
                self.preempt_at_segment, outcome = None, "Preempted"
            elif all(p.poll() is not None for p in procs):
                outcome = "Ended"
                if reclaimed:  # finalizing when the VM is taken back: the outputs are synced below, then Failed
                    self.reclaim_after_exit, outcome = False, "Reclaimed"
        if outcome != "Ended":
            for p in procs:
                p.kill()
            reclaim.thaw(frozen)  # what the killed instances started acts on its pending signals
        codes = [p.wait() for p in procs]
        self.exit_codes[name] = codes
        for mount in mounts:
            mount.settle()
            mount.close()
        if outcome == "Canceled":
            fake.set_status(name, "Canceled")
        elif outcome in ("Preempted", "Reclaimed") or any(codes):
            fake.set_status(name, "Failed")  # the job resource says no more: no error text
        else:
            fake.set_status(name, "Completed")

    def _start(self, props: dict, paths: dict, root: Path) -> list[subprocess.Popen]:
        count, port = props["resources"]["instanceCount"], free_port()
        command = BINDING.sub(lambda m: str(paths[(m.group(1), m.group(2))]), props["command"])
        procs = []
        for rank in range(count):
            node = root / f"node{rank}"
            env = {**self.container.env(node), **(props.get("environmentVariables") or {}),
                   **{f"AZURE_ML_{kind.upper()[:-1]}_{name}": str(path) for (kind, name), path in paths.items()},
                   "AZUREML_RUN_ID": root.name}
            if "distribution" in props:
                env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NODE_RANK=str(rank), RANK=str(rank),
                           WORLD_SIZE=str(count))
            with open(root / f"node{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(["bash", "-c", command], env=env, cwd=node, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        return procs


def _delete(client, name: str) -> None:
    from azure.core.exceptions import ResourceNotFoundError

    try:
        client.get_blob_client(name).delete_blob()
    except ResourceNotFoundError:
        pass

"""A test-side runner that plays SageMaker for the training jobs moto holds (tests/clouds/aws_server.py).

For each job created `InProgress/Starting` it does what SageMaker does: downloads the `bundle` channel, restores
the checkpoint LocalPath from CheckpointConfig.S3Uri, starts `python -m trainmaster.jobs.launcher` once per
instance with SageMaker's variables (SM_CHANNEL_BUNDLE, SM_MODEL_DIR, SM_HOSTS, SM_CURRENT_HOST, MASTER_PORT)
and `TRAINMASTER_OPT_ML` pointing at a temporary /opt/ml, mirrors node 0's checkpoint folder to the S3Uri while
it runs (every 0.2 s, and once more at the end), and sets the job's state: Training, then Completed (the model
folder tarred to `<S3OutputPath>/<job>/output/model.tar.gz`) or Failed with the launcher's exit code, with
BillableTimeInSeconds and TrainingTimeInSeconds. A stop request (`Stopping`) terminates the instances (Stopped).

`interrupt` plays a managed-spot interruption of the next job: once the synced checkpoints hold a segment, the
instances are killed (`Interrupted`); with "restart", after a pause the job starts again from the checkpoints
restored from S3, as SageMaker does (the pause is not billed, so BillableTimeInSeconds < TrainingTimeInSeconds);
with "end" the job ends `Stopped/Interrupted` (the broker sees it preempted and resumes it in a new attempt).
"""

from __future__ import annotations

import datetime
import io
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

from process_tree import kill_tree

from clouds.aws_server import MotoAws, set_training_status, training_job, training_jobs

SYNC_S = 0.2
RESTART_PAUSE_S = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


class SageMakerRunner:
    def __init__(self, aws: MotoAws, root: Path):
        self.s3, self.root = aws.client("s3"), root
        self.interrupt: str | None = None
        self.played: dict[str, threading.Thread] = {}
        self.launches: dict[str, int] = {}
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SageMakerRunner:
        self._watcher.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._done.set()
        self._watcher.join(5)
        for thread in self.played.values():
            thread.join(30)

    def _watch(self) -> None:
        while not self._done.is_set():
            for name, job in list(training_jobs().items()):
                if name not in self.played and job.training_job_status == "InProgress":
                    self.played[name] = threading.Thread(target=self.play, args=(name,), daemon=True)
                    self.played[name].start()
            time.sleep(0.05)

    def play(self, name: str) -> None:
        job = training_job(name)
        began, billable = time.time(), 0.0
        interrupt, self.interrupt = self.interrupt, None
        set_training_status(name, "InProgress", "Downloading")
        while True:
            set_training_status(name, "InProgress", "Training",
                                TrainingStartTime=datetime.datetime.fromtimestamp(began, datetime.timezone.utc))
            start = time.time()
            codes, why = self.launch(job, interrupt=interrupt is not None)
            billable += time.time() - start
            if why != "interrupted" or interrupt == "end":
                break
            interrupt = None
            set_training_status(name, "InProgress", "Interrupted")
            time.sleep(RESTART_PAUSE_S)
        ended = time.time()
        times = {"BillableTimeInSeconds": math.ceil(billable), "TrainingTimeInSeconds": math.ceil(ended - began),
                 "TrainingEndTime": datetime.datetime.fromtimestamp(ended, datetime.timezone.utc)}
        if why == "stopped":
            set_training_status(name, "Stopped", **times)
        elif why == "interrupted":
            set_training_status(name, "Stopped", "Interrupted", **times)
        elif any(codes):
            code = next(c for c in codes if c)
            set_training_status(name, "Failed", failure_reason=f"AlgorithmError: the launcher exited with code {code}",
                                **times)
        else:
            self._upload_model(job)
            set_training_status(name, "Completed", **times)

    def launch(self, job, *, interrupt: bool) -> tuple[list[int], str]:
        """Run the instances once; their exit codes and how the run ended (exited, stopped, interrupted)."""
        run = self.launches[job.training_job_name] = self.launches.get(job.training_job_name, 0) + 1
        count = job.resource_config["InstanceCount"]
        hosts = ["localhost", "127.0.0.1"][:count] if count <= 2 else [f"algo-{i + 1}" for i in range(count)]
        sync_uri = job.checkpoint_config["S3Uri"]
        homes = [self.root / job.training_job_name / f"run{run}" / f"host{i}" for i in range(count)]
        bundle_uri = next(c for c in job.input_data_config if c["ChannelName"] == "bundle")["DataSource"][
            "S3DataSource"]["S3Uri"]
        for home in homes:
            self._download(bundle_uri, home / "input" / "data" / "bundle")
        self._download(sync_uri, homes[0] / "checkpoints")
        port = free_port()
        procs = [self._start(job, home, hosts, host, port) for home, host in zip(homes, hosts)]
        mirror = Mirror(self.s3, homes[0] / "checkpoints", sync_uri)
        why = "exited"
        while any(p.poll() is None for p in procs):
            mirror.sync()
            if training_job(job.training_job_name).training_job_status == "Stopping" and why == "exited":
                why = "stopped"
                for proc in procs:
                    _signal(proc, signal.SIGTERM)
            if interrupt and why == "exited" and mirror.holds_segment():
                why = "interrupted"
                for proc in procs:
                    kill_tree(proc)  # the machine goes: the launcher and the job it started
            time.sleep(SYNC_S)
        if why != "interrupted":  # a killed instance gets no last sync
            mirror.sync()
        return [p.wait() for p in procs], why

    def _start(self, job, home: Path, hosts: list[str], host: str, port: int) -> subprocess.Popen:
        env = {**os.environ, **job.environment, "TRAINMASTER_OPT_ML": str(home),
               "SM_CHANNEL_BUNDLE": str(home / "input" / "data" / "bundle"), "SM_MODEL_DIR": str(home / "model"),
               "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": host, "MASTER_PORT": str(port)}
        (home / "model").mkdir(parents=True, exist_ok=True)
        log = open(home / "container.log", "wb")
        argv = job.algorithm_specification["ContainerEntrypoint"]
        argv = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
        return subprocess.Popen(argv, env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def _download(self, uri: str, folder: Path) -> None:
        """Every object under the S3 prefix into `folder`, by its path below the prefix (a single object by name)."""
        bucket, prefix = split(uri)
        folder.mkdir(parents=True, exist_ok=True)
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):].lstrip("/") or obj["Key"].rsplit("/", 1)[-1]
                (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(bucket, obj["Key"], str(folder / rel))

    def _upload_model(self, job) -> None:
        run = self.launches[job.training_job_name]
        model = self.root / job.training_job_name / f"run{run}" / "host0" / "model"
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w:gz") as tar:
            tar.add(model, arcname=".")
        bucket, prefix = split(job.output_data_config["S3OutputPath"])
        key = f"{prefix.rstrip('/')}/{job.training_job_name}/output/model.tar.gz"
        self.s3.put_object(Bucket=bucket, Key=key, Body=data.getvalue())


class Mirror:
    """Uploads the files of a local folder that changed since the last sync to an S3 prefix (SageMaker's
    checkpoint sync, which goes one way while the job runs)."""

    def __init__(self, s3, folder: Path, uri: str):
        self.s3, self.folder = s3, folder
        self.bucket, self.prefix = split(uri)
        self.seen: dict[Path, tuple[int, int]] = {}

    def sync(self) -> None:
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            try:
                stat = path.stat()
            except FileNotFoundError:  # renamed away while we looked (an atomic write)
                continue
            if self.seen.get(path) == (stat.st_size, stat.st_mtime_ns):
                continue
            self.seen[path] = (stat.st_size, stat.st_mtime_ns)
            key = self.prefix.rstrip("/") + "/" + path.relative_to(self.folder).as_posix()
            try:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=path.read_bytes())
            except FileNotFoundError:
                self.seen.pop(path)

    def holds_segment(self) -> bool:
        return any(self.folder.glob("checkpoints/segments/*/manifest.json"))


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass

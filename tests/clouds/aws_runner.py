"""A test-side runner that plays SageMaker for the training jobs moto holds (tests/clouds/aws_server.py).

For each job created `InProgress/Starting` it does what SageMaker does with a ContainerEntrypoint, and nothing
more: it pulls the image (only the test image, clouds/container.py, under the names the backend uses: another
is refused, FailureReason saying so), gives every instance (algo-1, algo-2, …) its own /opt/ml
(clouds/namespace.py: the real paths, in a mount namespace) with input/config/resourceconfig.json (`hosts`,
`current_host`, `network_interface_name`) and inputdataconfig.json, each channel's objects under
input/data/<channel>/, the checkpoint LocalPath restored from CheckpointConfig.S3Uri, model/ and output/; starts
the ContainerEntrypoint as given with the image's base environment, TRAINING_JOB_NAME, TRAINING_JOB_ARN and the
request's Environment (no SM_* variables: those come from the sagemaker-training toolkit, which an entrypoint
bypasses); mirrors each instance's checkpoint folder to the S3Uri while it runs (every 0.2 s, and once more at
the end; files removed are deleted there too) and sets the job's state: Training, then Completed (the model
folder tarred to `<S3OutputPath>/<job>/output/model.tar.gz`) or Failed with /opt/ml/output/failure as the
FailureReason (`AlgorithmError: …`), with BillableTimeInSeconds and TrainingTimeInSeconds. A stop request
(`Stopping`) sends the instances SIGTERM (Stopped).

`interrupt` plays a managed-spot interruption of the next job: once an instance's checkpoint folder holds a
segment, the instances are frozen, their folders synced, and they are killed (`Interrupted`; clouds/reclaim.py);
with "restart", after a pause the job starts again from the checkpoints restored from S3, as SageMaker does (the
pause is not billed, so BillableTimeInSeconds < TrainingTimeInSeconds); with "end" the job ends
`Stopped/Interrupted` (the broker sees it preempted and resumes it in a new attempt).
`started` records, per job, when its first container started (the benchmark's submit-to-start time).
"""

from __future__ import annotations

import datetime
import io
import json
import math
import os
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path

from process_tree import kill_tree

from clouds import reclaim
from clouds.aws_server import REGION, MotoAws, set_training_status, training_job, training_jobs
from clouds.namespace import in_instance

SYNC_S = 0.2
RESTART_PAUSE_S = 2.0


def split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def images() -> set[str]:
    """The image names the test image answers to: the test image and the backend's default ones (py311)."""
    from trainmaster.backends.aws.backend import IMAGE as DEFAULT

    from clouds.container import IMAGE

    return {IMAGE} | {DEFAULT.format(region=REGION, device=device) for device in ("cpu", "gpu")}


class SageMakerRunner:
    def __init__(self, aws: MotoAws, root: Path, container):
        self.s3, self.root, self.container = aws.client("s3"), root, container
        self.interrupt: str | None = None
        self.played: dict[str, threading.Thread] = {}
        self.launches: dict[str, int] = {}
        self.started: dict[str, float] = {}
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
        if job.algorithm_specification["TrainingImage"] not in images():
            set_training_status(name, "Failed", failure_reason="ClientError: the training image "
                                f"{job.algorithm_specification['TrainingImage']} cannot be pulled",
                                TrainingEndTime=datetime.datetime.now(datetime.timezone.utc))
            return
        while True:
            set_training_status(name, "InProgress", "Training",
                                TrainingStartTime=datetime.datetime.fromtimestamp(began, datetime.timezone.utc))
            start = time.time()
            codes, why, failure = self.launch(job, interrupt=interrupt is not None)
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
            said = failure or f", exit code: {code}"
            set_training_status(name, "Failed", failure_reason=f"AlgorithmError: {said}", **times)
        else:
            self._upload_model(job)
            set_training_status(name, "Completed", **times)

    def launch(self, job, *, interrupt: bool) -> tuple[list[int], str, str | None]:
        """Run the instances once; their exit codes, how the run ended (exited, stopped, interrupted) and the first
        instance's /opt/ml/output/failure."""
        name = job.training_job_name
        run = self.launches[name] = self.launches.get(name, 0) + 1
        count = job.resource_config["InstanceCount"]
        hosts = [f"algo-{i + 1}" for i in range(count)]
        sync_uri = job.checkpoint_config["S3Uri"]
        homes = [self.root / name / f"run{run}" / host for host in hosts]
        channels = {c["ChannelName"]: c for c in job.input_data_config}
        for home, host in zip(homes, hosts):
            config = home / "input" / "config"
            config.mkdir(parents=True)
            (config / "resourceconfig.json").write_text(json.dumps(
                {"current_host": host, "current_instance_type": job.resource_config["InstanceType"],
                 "current_group_name": "homogeneousCluster", "hosts": hosts, "network_interface_name": "eth0",
                 "instance_groups": [{"instance_group_name": "homogeneousCluster", "hosts": hosts,
                                      "instance_type": job.resource_config["InstanceType"]}]}))
            (config / "inputdataconfig.json").write_text(json.dumps(
                {channel: {"TrainingInputMode": c.get("InputMode", "File"), "S3DistributionType": "FullyReplicated",
                           "RecordWrapperType": "None"} for channel, c in channels.items()}))
            for channel, c in channels.items():
                self._download(c["DataSource"]["S3DataSource"]["S3Uri"], home / "input" / "data" / channel)
            for folder in ("model", "output", "checkpoints"):
                (home / folder).mkdir(exist_ok=True)
            self._download(sync_uri, home / "checkpoints")
        self.started.setdefault(name, time.time())
        procs = [self._start(job, home, hosts) for home in homes]
        mirrors = [Mirror(self.s3, home / "checkpoints", sync_uri) for home in homes]
        why, tick = "exited", 0.0
        while any(p.poll() is None for p in procs):
            if interrupt and why == "exited" and reclaim.segment_on_disk(mirrors[0].folder / "checkpoints"):
                reclaim.freeze(procs)
                for mirror in mirrors:
                    mirror.sync()  # what the instance held when reclaimed is synced
                why = "interrupted"
                for proc in procs:
                    kill_tree(proc)  # the machine goes: the launcher and the job it started
                break
            if time.monotonic() >= tick:
                for mirror in mirrors:
                    mirror.sync()
                if training_job(name).training_job_status == "Stopping" and why == "exited":
                    why = "stopped"
                    for proc in procs:
                        _signal(proc, signal.SIGTERM)
                tick = time.monotonic() + SYNC_S
            time.sleep(reclaim.POLL_S if interrupt and why == "exited" else SYNC_S)
        if why != "interrupted":  # a killed instance gets no last sync
            for mirror in mirrors:
                mirror.sync()
        failure = next((f.read_text()[:1024] for f in (h / "output" / "failure" for h in homes) if f.is_file()), None)
        return [p.wait() for p in procs], why, failure

    def _start(self, job, home: Path, hosts: list[str]) -> subprocess.Popen:
        env = {**self.container.env(home.parent / f"{home.name}-scratch"),
               "TRAINING_JOB_NAME": job.training_job_name, "TRAINING_JOB_ARN": job.arn,
               **(job.environment or {})}
        argv = self.container.argv(job.algorithm_specification["ContainerEntrypoint"])
        log = open(home.parent / f"{home.name}.log", "wb")
        return subprocess.Popen(in_instance(argv, home, hosts), env=env, cwd="/", stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

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
        model = self.root / job.training_job_name / f"run{run}" / "algo-1" / "model"
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w:gz") as tar:
            tar.add(model, arcname=".")
        bucket, prefix = split(job.output_data_config["S3OutputPath"])
        key = f"{prefix.rstrip('/')}/{job.training_job_name}/output/model.tar.gz"
        self.s3.put_object(Bucket=bucket, Key=key, Body=data.getvalue())


class Mirror:
    """Uploads the files of a local folder that changed since the last sync to an S3 prefix, and deletes there the
    ones removed (SageMaker's checkpoint sync, which goes one way while the job runs)."""

    def __init__(self, s3, folder: Path, uri: str):
        self.s3, self.folder = s3, folder
        self.bucket, self.prefix = split(uri)
        self.seen: dict[Path, tuple[int, int]] = {}
        for path in (p for p in folder.rglob("*") if p.is_file()):  # restored from the prefix: already there
            stat = path.stat()
            self.seen[path] = (stat.st_size, stat.st_mtime_ns)

    def sync(self) -> None:
        here = set()
        for path in sorted(p for p in self.folder.rglob("*") if p.is_file()):
            try:
                stat = path.stat()
            except FileNotFoundError:  # renamed away while we looked (an atomic write)
                continue
            here.add(path)
            if self.seen.get(path) == (stat.st_size, stat.st_mtime_ns):
                continue
            self.seen[path] = (stat.st_size, stat.st_mtime_ns)
            try:
                self.s3.put_object(Bucket=self.bucket, Key=self._key(path), Body=path.read_bytes())
            except FileNotFoundError:
                self.seen.pop(path)
        for gone in set(self.seen) - here:
            del self.seen[gone]
            self.s3.delete_object(Bucket=self.bucket, Key=self._key(gone))

    def _key(self, path: Path) -> str:
        return self.prefix.rstrip("/") + "/" + path.relative_to(self.folder).as_posix()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass

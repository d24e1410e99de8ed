"""A managed backend over a folder: an ObjectStore on the local filesystem and a service whose states the test sets.

For the generic backend's own logic (backends/managed/backend.py: content-addressed upload, resume carry, the
output manifest checks, logs by offset, cost); each cloud's real SDK against its local server is tested in
tests/test_aws_*.py, tests/test_gcp_*.py and tests/test_azure_*.py.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from trainmaster.backends.base import Phase
from trainmaster.backends.managed.backend import ManagedBackend
from trainmaster.backends.managed.config import ManagedConfig
from trainmaster.backends.managed.training_service import ServiceJob, ServiceState, TrainingService
from trainmaster.backends.object_store import ObjectStore, StoredObject


class FolderStore(ObjectStore):
    scheme = "file"

    def __init__(self, root: Path):
        self.root = root
        self.uploads: list[str] = []

    def uri(self, key: str = "") -> str:
        return f"file://{self.root}/{key}"

    async def size(self, key):
        path = self.root / key
        return path.stat().st_size if path.is_file() else None

    async def upload(self, path, key, progress=None):
        self.uploads.append(key)
        (self.root / key).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, self.root / key)
        if progress:
            progress(path.stat().st_size, path.stat().st_size)

    async def read(self, key, offset=0, limit=None):
        path = self.root / key
        if not path.is_file():
            return None
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read() if limit is None else f.read(limit)

    async def stream(self, key, offset=0):
        data = await self.read(key, offset)
        for i in range(0, len(data or b""), 3):
            yield data[i:i + 3]
            await asyncio.sleep(0)

    async def list(self, prefix):
        found = []
        for path in sorted(self.root.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if path.is_file() and key.startswith(prefix):
                found.append(StoredObject(key=key, size=path.stat().st_size))
        return found

    async def copy(self, source, target):
        (self.root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / source, self.root / target)


class SetService(TrainingService):
    def __init__(self):
        self.jobs: dict[str, ServiceJob] = {}
        self.states: dict[str, ServiceState] = {}
        self.stopped: list[str] = []

    async def start(self, job):
        if job.name not in self.jobs:
            self.jobs[job.name] = job
            self.states[job.name] = ServiceState(phase=Phase.pending)

    async def describe(self, name):
        return self.states[name]

    async def stop(self, name):
        self.stopped.append(name)


class FolderBackend(ManagedBackend):
    name = "aws"  # priced and egressed as AWS
    service_name = "sagemaker"

    def __init__(self, root: Path, poll_s: float = 1e-6):
        super().__init__(ManagedConfig(setup="", poll_s=poll_s))
        self._store, self._service = FolderStore(root), SetService()

    def default_image(self, offer):
        return "image:1"

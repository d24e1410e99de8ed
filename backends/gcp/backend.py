"""Google Cloud as a managed backend: Vertex AI CustomJobs (gcp/vertex.py) over a Cloud Storage bucket (gcp/gcs.py).

An attempt's folder is `attempts/<attempt id>/` of the staging bucket, the job's base output directory: its
`checkpoints/` is the synced folder the launcher writes through Vertex's /gcs mount (AIP_CHECKPOINT_DIR), its
`model/` is AIP_MODEL_DIR. The bundle is read from the bucket through that mount too.
"""

from __future__ import annotations

from trainmaster.backends.base import Offer
from trainmaster.backends.gcp.config import GcpConfig
from trainmaster.backends.gcp.gcs import GcsStore
from trainmaster.backends.gcp.vertex import CHECKPOINTS, VertexService
from trainmaster.backends.managed.backend import ManagedBackend

IMAGES = {True: "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
          False: "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"}
"""Vertex AI's prebuilt PyTorch training images, for GPU offers and CPU-only ones (Python 3.10, torch 2.4)."""


class GcpBackend(ManagedBackend):
    name = "gcp"
    service_name = "vertex"
    default_python = "3.10"
    config_model = GcpConfig
    config: GcpConfig

    def make_store(self) -> GcsStore:
        return GcsStore(self.config)

    def make_service(self) -> VertexService:
        return VertexService(self.config)

    def default_image(self, offer: Offer) -> str:
        return IMAGES[offer.gpu_count > 0]

    def regions(self) -> list[str] | None:
        return [self.config.location]

    def sync_key(self, attempt_id: str) -> str:
        return f"attempts/{attempt_id}/{CHECKPOINTS}"

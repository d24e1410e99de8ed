"""Azure: the managed backend over Azure ML command jobs (azureml.py) and a Blob container (blob.py)."""

from __future__ import annotations

from trainmaster.backends.azure.azureml import AzureMLService
from trainmaster.backends.azure.blob import BlobStore
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import Offer
from trainmaster.backends.managed.backend import ManagedBackend

IMAGE = "mcr.microsoft.com/azureml/curated/acpt-pytorch-2.2-cuda12.1:latest"
"""Azure ML's curated PyTorch training image (the same in every region)."""


class AzureBackend(ManagedBackend):
    name = "azure"
    service_name = "azureml"
    config_model = AzureConfig
    config: AzureConfig

    def make_store(self) -> BlobStore:
        return BlobStore(self.config)

    def make_service(self) -> AzureMLService:
        return AzureMLService(self.config)

    def default_image(self, offer: Offer) -> str:
        return IMAGE

    def regions(self) -> list[str] | None:
        return [self.config.region] if self.config.region else None

"""Azure: the managed backend over Azure ML command jobs (azureml.py) and a Blob container (blob.py).

Jobs name the container through the workspace's datastore for it (`azure.datastore`), the URI form Azure ML
takes for a job's inputs and outputs. On a compute cluster (`azure.compute`) the cluster's VM size and tier are
what runs, so the offers are that size's only (`azure.compute_vm_size`; spot when the cluster is low priority).
"""

from __future__ import annotations

from trainmaster.backends.azure.azureml import AzureMLService
from trainmaster.backends.azure.blob import BlobStore
from trainmaster.backends.azure.config import AzureConfig
from trainmaster.backends.base import ConfigurationError, Offer, OfferRequest, OfferSet
from trainmaster.backends.managed.backend import ManagedBackend

IMAGE = "mcr.microsoft.com/azureml/curated/acpt-pytorch-2.2-cuda12.1:latest"
"""Azure ML's curated PyTorch training image (the same in every region; Python 3.10, torch 2.2)."""


class AzureBackend(ManagedBackend):
    name = "azure"
    service_name = "azureml"
    default_python = "3.10"
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

    def service_uri(self, key: str) -> str:
        """`key` as a datastore URI (what Azure ML takes for a job's inputs and read-write outputs)."""
        if not self.config.datastore:
            raise ConfigurationError("azure.datastore is not set: the Azure ML datastore registered for the "
                                     f"container {self.config.container} (docs/clouds.md)")
        return f"azureml://datastores/{self.config.datastore}/paths/{self.store.prefix}{key}"

    async def offers(self, request: OfferRequest) -> OfferSet:
        found = await super().offers(request)
        if not self.config.compute or not found.offers:
            return found
        size, spot = self.config.compute_vm_size, self.config.compute_tier == "low_priority"
        kept = [o for o in found.offers if o.instance.lower() == (size or "").lower() and o.spot == spot]
        if kept:
            return found.model_copy(update={"offers": kept})
        return OfferSet(backend=self.name, reasons=[
            f"the compute cluster {self.config.compute} runs {size or '(azure.compute_vm_size not set)'} "
            f"{'low priority' if spot else 'dedicated'}, and no catalog row of that size fits the job"])

"""The AWS backend: the managed backend over SageMaker (`sagemaker.py`) and S3 (`s3.py`), creating jobs in the
configured region (the profile's or AWS_REGION when `aws.region` is not set)."""

from __future__ import annotations

from trainmaster.backends.aws import sdk
from trainmaster.backends.aws.config import AwsConfig
from trainmaster.backends.aws.s3 import S3Store
from trainmaster.backends.aws.sagemaker import SageMakerService
from trainmaster.backends.base import Offer
from trainmaster.backends.managed.backend import ManagedBackend

IMAGE = "763104351884.dkr.ecr.{region}.amazonaws.com/pytorch-training:2.5-{device}-py311"
"""The AWS Deep Learning Containers' PyTorch training image (Python 3.11, torch 2.5): the container runs the
boot script shipped with the job (jobs/launcher_boot.py), nothing installed into it."""


class AwsBackend(ManagedBackend):
    name = "aws"
    service_name = "sagemaker"
    config_model = AwsConfig
    config: AwsConfig

    def make_store(self) -> S3Store:
        return S3Store(self.config)

    def make_service(self) -> SageMakerService:
        return SageMakerService(self.config)

    def regions(self) -> list[str] | None:
        """The one region jobs are created in; None when none is set (the readiness check says so)."""
        region = self.config.region or sdk.session(self.config).region_name
        return [region] if region else None

    def default_image(self, offer: Offer) -> str:
        return IMAGE.format(region=offer.region, device="gpu" if offer.gpu_count else "cpu")

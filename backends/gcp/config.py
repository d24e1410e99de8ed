"""Google Cloud settings (`gcp:` in backends.yaml). Credentials are not kept here: a service-account
key file is named, or Application Default Credentials are used."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.base import BackendConfig


class GcpConfig(BackendConfig):
    project: str | None = Field(None, description="Project id; default: the credentials' project or GOOGLE_CLOUD_PROJECT.")
    location: str = Field("us-central1", description="Vertex AI region jobs are created in.")
    staging_bucket: str | None = Field(None, pattern=r"^gs://.+", description="gs:// bucket where bundles and outputs are staged.")
    api_endpoint: str | None = Field(None, description="Another Vertex AI endpoint (private service connect).")
    credentials_file: str | None = Field(None, description="Service-account key file; default: Application Default Credentials.")

"""Google Cloud settings (`gcp:` in backends.yaml): Vertex AI and the Cloud Storage bucket runs are staged in,
beside every managed backend's own (image, setup, max wait, poll). Credentials are not kept here: a
service-account key file is named, or Application Default Credentials are used."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.managed.config import ManagedConfig


class GcpConfig(ManagedConfig):
    project: str | None = Field(None, description="Project id; default: the credentials' project or "
                                                  "GOOGLE_CLOUD_PROJECT.")
    location: str = Field("us-central1", description="Vertex AI region jobs are created in.")
    staging_bucket: str | None = Field(None, pattern=r"^gs://.+", description="gs://bucket/prefix where bundles "
                                                                             "and attempts are staged (required to "
                                                                             "dispatch).")
    api_endpoint: str | None = Field(None, description="Another Vertex AI endpoint (private service connect); one with "
                                                       "a scheme (http://host:port) is spoken to over REST.")
    credentials_file: str | None = Field(None, description="A service account's key file (or an authorized user's); "
                                                           "default: Application Default Credentials.")
    upload_chunk_mb: int = Field(32, ge=1, le=1024, description="Size of each part of a resumable upload to Cloud "
                                                               "Storage, in MiB (rounded down to 256 KiB).")
    service_account: str | None = Field(None, description="Service account the jobs run as; default: Vertex AI's.")

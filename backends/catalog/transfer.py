"""Data transfer prices: what moving a job's input out of the cloud that holds it costs.

Internet egress list prices for the first tier (the first 10 TB a month on AWS and Azure, the
first TB on GCP's premium tier), in micro-USD per GB (10^9 bytes). Moving data within one cloud is
taken as free (same-region reads are; cross-region transfer, at about $0.02/GB, is left out).
Uploading local files is free everywhere (ingress).
"""

from __future__ import annotations

EGRESS_MICRO_USD_PER_GB: dict[str, int] = {"aws": 90_000, "gcp": 120_000, "azure": 87_000}
SCHEME_CLOUD: dict[str, str] = {"s3": "aws", "gs": "gcp", "az": "azure"}


def source_cloud(uri: str) -> str | None:
    """The cloud that holds a data URI (`s3://…` → aws), or None for a local path."""
    scheme, sep, _ = uri.partition("://")
    return SCHEME_CLOUD.get(scheme) if sep else None


def egress_micro_usd(source: str | None, destination: str, size_bytes: int) -> int:
    """Cost of moving `size_bytes` from `source` (a cloud, or None for local) to `destination` (a backend)."""
    if source is None or source == destination:
        return 0
    return -(-size_bytes * EGRESS_MICRO_USD_PER_GB[source] // 10**9)

"""Price catalogs for the clouds (shipped CSVs + the user's overrides), GPU speeds, transfer prices."""

from trainmaster.backends.catalog.gpus import THROUGHPUT, canonical_gpu, gpu_matches, throughput
from trainmaster.backends.catalog.load import (
    CLOUDS, Catalog, CatalogRow, CatalogSource, StaleCatalogWarning, load_catalog, read_catalog,
)
from trainmaster.backends.catalog.offers import catalog_offers

__all__ = [
    "CLOUDS", "THROUGHPUT", "Catalog", "CatalogRow", "CatalogSource", "StaleCatalogWarning", "canonical_gpu",
    "catalog_offers", "gpu_matches", "load_catalog", "read_catalog", "throughput",
]

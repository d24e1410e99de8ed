"""Keeping files: the shared storage bundles and accepted outputs are put in, and what is given back to the
disk under the retention policy (`trainmaster gc`)."""

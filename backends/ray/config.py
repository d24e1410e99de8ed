"""The Ray backend's settings (`ray:` in backends.yaml): where the cluster's Jobs API listens, the folder every node
(and this machine) sees at the same path, the interpreter on the nodes, pip's options there, and what the machines'
power costs."""

from __future__ import annotations

from pydantic import Field

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.power import PowerModel


class RayConfig(BackendConfig):
    overridable = ("power",)  # your own machines, priced like `local` (a policy's `power:` wins)

    address: str = Field("http://127.0.0.1:8265", description="The cluster's dashboard, which serves the Jobs API.")
    namespace: str | None = Field(None, description="The Ray namespace jobs run in (their RAY_NAMESPACE); "
                                                    "default: Ray's own, one per job.")
    storage_path: str | None = Field(None, description="A folder every node and this machine see at the same path "
                                                       "(NFS, a shared disk): each attempt's outputs, checkpoints, "
                                                       "log and exit record are kept there.")
    python: str = Field("python", description="The interpreter on the nodes that has trainmaster installed (it "
                                              "runs `-m trainmaster.jobs.launcher`).")
    pip_install_options: list[str] = Field(
        default_factory=list, description="Options for pip as it installs an `environment: requirements` job's "
                                          "requirements on the nodes (Ray's runtime environment), after Ray's own: "
                                          "e.g. [--no-index, --find-links, /shared/wheels] on a cluster offline.")
    power: PowerModel = Field(default_factory=PowerModel, description="Prices runs on the cluster's machines.")
    timeout_s: float = Field(5.0, gt=0, description="How long a call to the dashboard may take.")

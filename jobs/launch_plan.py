"""What a backend tells the launcher it starts inside a machine it does not run itself (a cloud container).

The managed backends (SageMaker, Vertex AI, Azure ML) put this plan as `launch.json` in the job's input, beside
the boot script that starts `python -m trainmaster.jobs.launcher` in the cloud's image (jobs/launcher_boot.py);
the Ray backend (through the Ray Jobs API) passes it as one variable, `TRAINMASTER_LAUNCH`. The launcher
(jobs/launcher.py) finds the bundle and the synced folder where the service puts them, checks the bundle's
sha256, maps the service's own variables and files (model dir, checkpoint dir, hosts, rendezvous) to ours and
runs the entrypoint under torchrun across the service's instances. The plan is the whole contract between the
broker's side and the container: nothing else is shared.

The synced folder (`sync`) is the one place both sides see: the service copies it to the attempt's prefix in
the object store as the run goes (SageMaker's checkpoint sync, Vertex's and Azure ML's mounted buckets). Node 0
keeps there, under fixed names (`SYNC_*`): the job's outputs and checkpoints, its log (`log/` parts on an
object-store mount, `job.log` on Ray's shared filesystem), and its exit record.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

VARIABLE = "TRAINMASTER_LAUNCH"
"""The plan as JSON in the environment (the Ray backend: the Jobs API's runtime env has no value limit)."""
FILE_VARIABLE = "TRAINMASTER_LAUNCH_FILE"
"""The path of the plan as a file (the managed services: `launch.json` of the job's input, named by the boot
script, jobs/launcher_boot.py; SageMaker caps an Environment value at 512 characters)."""
SERVICES = ("sagemaker", "vertex", "azureml", "ray")

SYNC_OUTPUTS = "outputs"
"""The job's TRAINMASTER_OUTPUT_DIR under the synced folder (fetched as the attempt's outputs)."""
SYNC_CHECKPOINTS = "checkpoints"
"""The job's TRAINMASTER_CHECKPOINT_DIR (the runtime's segments; resumed from when it holds one)."""
SYNC_LOG = "job.log"
"""Everything the entrypoint printed on node 0, and the launcher's own lines (read by offset), on a shared
filesystem (Ray); on an object-store mount the same bytes are `log/<offset>.log` parts (jobs/launcher_publish.py)."""
SYNC_MANIFEST = "outputs.json"
"""Written once the entrypoint ended, before the exit record: {"files": {path: {"size", "sha256"}}} of outputs/."""
SYNC_EXIT = "exit.json"
"""Written once the entrypoint ended: {"exit_code", "reason", "started_at", "ended_at"}."""


class LaunchPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    service: Literal["sagemaker", "vertex", "azureml", "ray"]
    entrypoint: str
    launcher: Literal["auto", "torchrun", "direct"] = "auto"
    nproc: int = Field(1, ge=1, description="Processes per node (torchrun --nproc-per-node).")
    nodes: int = Field(1, ge=1, description="Instances the service runs the container on.")
    bundle: str = Field("", description="Where the bundle is: a path, a gs:// URI (Vertex: read through its "
                                        "/gcs mount), or empty for the service's input (SageMaker's `bundle` "
                                        "channel, Azure ML's `bundle` input); Ray: the file's name in the "
                                        "job's working directory.")
    bundle_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    sync: str = Field("", description="The synced folder: a path (SageMaker's checkpoint LocalPath), or empty "
                                      "for the service's (Vertex AIP_CHECKPOINT_DIR, Azure ML's `sync` output); "
                                      "Ray: the attempt's folder under the cluster's shared storage path.")
    env: dict[str, str] = Field(default_factory=dict, description="The spec's env and trainmaster's job variables "
                                                                  "(job id, seed, segment steps, bundle sha256); the "
                                                                  "launcher adds the folders.")
    master_port: int = Field(29500, ge=1, le=65535, description="torchrun's rendezvous port on node 0 when the "
                                                                "service names none.")

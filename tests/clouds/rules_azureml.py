"""Azure ML's own rules for the requests trainmaster sends, from its REST specification
(azure-rest-api-specs, specification/machinelearningservices, Microsoft.MachineLearningServices `mfe.json`: the
CommandJob, JobInput/JobOutput, QueueSettings, JobResourceConfiguration and environment version definitions)
and the service's documented data URIs. azure-ai-ml's own `_validate()` checks neither the names nor the URIs.

* resource names (a job, an environment): `^[a-zA-Z0-9][a-zA-Z0-9\\-_]{0,254}$`; an environment's version the same;
* a command job: `jobType` Command; `command` and `environmentId` at least one character, holding a letter, digit
  or `_`; no property the schema does not have;
* `computeId` a workspace compute's full ARM id; `resources.instanceCount` at least 1, `shmSize` `\\d+[bBkKmMgG]`;
* `queueSettings.jobTier` one of Null, Spot, Basic, Standard, Premium; `distribution` PyTorch, Mpi or
  TensorFlow, `processCountPerInstance` at least 1; `limits` Command with an ISO 8601 `timeout`;
* inputs: `jobInputType` one of the input types, `mode` one of ReadOnlyMount, ReadWriteMount, Download, Direct,
  EvalMount, EvalDownload, `uri` required (a datastore URI `azureml://datastores/<name>/paths/<path>`, an https://,
  wasbs:// or abfss:// URL, or an `azureml:` asset);
* outputs: `jobOutputType` one of the output types, `mode` ReadWriteMount, Upload or Direct, `uri` a datastore URI
  (Azure ML writes a job's outputs through a datastore, never to a raw storage URL);
* every datastore a URI names must be registered in the workspace (the fake's `datastores`);
* environment variables and tags: string values, names of letters, digits and `_` not starting with a digit.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9\-_]{0,254}")
HAS_WORD = re.compile(r"[a-zA-Z0-9_]")
SHM = re.compile(r"\d+[bBkKmMgG]")
DURATION = re.compile(r"P(?!$)(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?")
DATASTORE = re.compile(r"azureml://datastores/(?P<name>[^/]+)/paths/(?P<path>.+)")
COMPUTE = re.compile(r"/subscriptions/[^/]+/resourceGroups/[^/]+/providers/Microsoft\.MachineLearningServices/"
                     r"workspaces/[^/]+/computes/[^/]+", re.IGNORECASE)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INPUT_TYPES = {"literal", "uri_file", "uri_folder", "mltable", "custom_model", "mlflow_model", "triton_model"}
OUTPUT_TYPES = {"uri_file", "uri_folder", "mltable", "custom_model", "mlflow_model", "triton_model"}
INPUT_MODES = {"ReadOnlyMount", "ReadWriteMount", "Download", "Direct", "EvalMount", "EvalDownload"}
OUTPUT_MODES = {"ReadWriteMount", "Upload", "Direct"}
TIERS = {"Null", "Spot", "Basic", "Standard", "Premium"}
DISTRIBUTIONS = {"PyTorch", "Mpi", "TensorFlow"}
JOB_FIELDS = {"jobType", "command", "computeId", "environmentId", "environmentVariables", "queueSettings",
              "experimentName", "displayName", "inputs", "outputs", "resources", "distribution", "limits", "tags",
              "properties", "isArchived", "services", "description", "codeId", "identity", "notificationSetting",
              "parentJobName", "componentId"}
ENVIRONMENT_FIELDS = {"image", "isAnonymous", "isArchived", "osType", "description", "tags", "properties"}


def name_problems(kind: str, name: str) -> list[str]:
    return [] if NAME.fullmatch(name) else [f"{kind} name {name!r} does not match {NAME.pattern!r}"]


def _uri_datastore(uri: str) -> str | None:
    match = DATASTORE.fullmatch(uri)
    return match["name"] if match else None


def job_problems(name: str, body, datastores: set[str]) -> list[str]:
    """What breaks Azure ML's rules in a command job PUT (`body` as received)."""
    found = name_problems("job", name)
    if not isinstance(body, dict) or set(body) - {"properties"}:
        return found + ["the body holds only `properties`"]
    props = body.get("properties")
    if not isinstance(props, dict):
        return found + ["properties is required"]
    if unknown := set(props) - JOB_FIELDS:
        found.append(f"unknown properties {sorted(unknown)}")
    if props.get("jobType") != "Command":
        found.append(f"jobType {props.get('jobType')!r} is not a command job")
    for field in ("command", "environmentId"):
        value = props.get(field)
        if not isinstance(value, str) or not value or not HAS_WORD.search(value):
            found.append(f"{field} is required: at least one character, holding a letter, digit or _")
    if "computeId" in props and not (isinstance(props["computeId"], str) and COMPUTE.fullmatch(props["computeId"])):
        found.append(f"computeId {props['computeId']!r} is not a workspace compute's ARM id")
    resources = props.get("resources") or {}
    if "instanceCount" in resources and not (isinstance(resources["instanceCount"], int)
                                             and resources["instanceCount"] >= 1):
        found.append(f"resources.instanceCount {resources['instanceCount']!r} must be an integer of at least 1")
    if "shmSize" in resources and not SHM.fullmatch(str(resources["shmSize"])):
        found.append(f"resources.shmSize {resources['shmSize']!r} does not match {SHM.pattern!r}")
    tier = (props.get("queueSettings") or {}).get("jobTier")
    if tier is not None and tier not in TIERS:
        found.append(f"queueSettings.jobTier {tier!r} is not one of {sorted(TIERS)}")
    distribution = props.get("distribution")
    if distribution is not None:
        if distribution.get("distributionType") not in DISTRIBUTIONS:
            found.append(f"distribution.distributionType {distribution.get('distributionType')!r} is unknown")
        count = distribution.get("processCountPerInstance")
        if count is not None and not (isinstance(count, int) and count >= 1):
            found.append(f"distribution.processCountPerInstance {count!r} must be at least 1")
    limits = props.get("limits")
    if limits is not None:
        if limits.get("jobLimitsType") != "Command":
            found.append(f"limits.jobLimitsType {limits.get('jobLimitsType')!r} is not Command")
        if "timeout" in limits and not DURATION.fullmatch(str(limits["timeout"])):
            found.append(f"limits.timeout {limits['timeout']!r} is not an ISO 8601 duration")
    for key, value in (props.get("environmentVariables") or {}).items():
        if not ENV_NAME.fullmatch(key) or not isinstance(value, str):
            found.append(f"environment variable {key!r}: a name of letters, digits and _ with a string value")
    for key, value in (props.get("tags") or {}).items():
        if not isinstance(value, str):
            found.append(f"tag {key!r}: a string value")
    for input_name, given in (props.get("inputs") or {}).items():
        found += _input(input_name, given, datastores)
    for output_name, given in (props.get("outputs") or {}).items():
        found += _output(output_name, given, datastores)
    return found


def _input(name: str, given: dict, datastores: set[str]) -> list[str]:
    found = []
    kind = given.get("jobInputType")
    if kind not in INPUT_TYPES:
        return [f"inputs.{name}.jobInputType {kind!r} is not one of {sorted(INPUT_TYPES)}"]
    if kind == "literal":
        return [] if given.get("value") else [f"inputs.{name}.value is required"]
    if given.get("mode") is not None and given["mode"] not in INPUT_MODES:
        found.append(f"inputs.{name}.mode {given['mode']!r} is not one of {sorted(INPUT_MODES)}")
    uri = given.get("uri")
    if not isinstance(uri, str) or not uri or not HAS_WORD.search(uri):
        return found + [f"inputs.{name}.uri is required"]
    if not uri.startswith(("azureml://", "https://", "wasbs://", "abfss://", "azureml:")):
        found.append(f"inputs.{name}.uri {uri!r} is not a form Azure ML reads")
    store = _uri_datastore(uri)
    if uri.startswith("azureml://") and store is None:
        found.append(f"inputs.{name}.uri {uri!r} is not azureml://datastores/<name>/paths/<path>")
    if store is not None and store not in datastores:
        found.append(f"inputs.{name}.uri names the datastore {store!r}, which the workspace does not have")
    return found


def _output(name: str, given: dict, datastores: set[str]) -> list[str]:
    found = []
    kind = given.get("jobOutputType")
    if kind not in OUTPUT_TYPES:
        return [f"outputs.{name}.jobOutputType {kind!r} is not one of {sorted(OUTPUT_TYPES)}"]
    if given.get("mode") is not None and given["mode"] not in OUTPUT_MODES:
        found.append(f"outputs.{name}.mode {given['mode']!r} is not one of {sorted(OUTPUT_MODES)}")
    uri = given.get("uri")
    if uri is not None:
        store = _uri_datastore(uri)
        if store is None:
            found.append(f"outputs.{name}.uri {uri!r}: a job's output is written through a datastore "
                         "(azureml://datastores/<name>/paths/<path>), not a storage URL")
        elif store not in datastores:
            found.append(f"outputs.{name}.uri names the datastore {store!r}, which the workspace does not have")
    return found


def environment_problems(name: str, version: str, body) -> list[str]:
    found = name_problems("environment", name) + name_problems("environment version", version)
    props = body.get("properties") if isinstance(body, dict) else None
    if not isinstance(props, dict):
        return found + ["properties is required"]
    if unknown := set(props) - ENVIRONMENT_FIELDS:
        found.append(f"unknown environment properties {sorted(unknown)}")
    if not props.get("image"):
        found.append("an environment needs an image (or a build, which trainmaster never sends)")
    return found

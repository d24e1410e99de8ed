"""Azure end to end through the real CLI: `trainmaster submit --wait` under a policy whose primary is azure,
backends.yaml pointing at the strict Azure ML fake and Azurite, and a test-side runner playing Azure ML
(tests/clouds/azure_runner.py: the launcher in a subprocess per instance). A spot job preempted mid-run, or reclaimed
after its entrypoint exited 0 while the service was finalizing it, resumes from its synced checkpoints to the bytes
of an uninterrupted run, is fetched, verified and charged what the service billed; a 2-node gloo job; throttling
retried; capacity refused at submit falls back to local; a job failing inside the service ends with its reason and
exit code; `cancel` stops the Azure ML job."""

from __future__ import annotations

import json
import os
import time

import pytest

from clouds.azure_runner import AzureMLRunner
from trainmaster.backends.managed.names import job_name
from miner_support import shown, tm
from repo_paths import TESTS
from state_rows import state_rows
from tiny_lm_job import EVALUATOR, JOB, TINY_LM, short_job

pytest_plugins = ["clouds.conftest_azure"]
pytestmark = pytest.mark.slow

GLOO = """\
import os, pathlib
import torch.distributed as dist
import torch

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
if dist.get_rank() == 0:
    pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "sum.txt").write_text(str(int(total)))
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {int(total)}", flush=True)
dist.destroy_process_group()
"""
FAILING = "import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n"


@pytest.fixture
def cli(azure, azure_config, tm_home, tmp_path, monkeypatch, test_image):
    """backends.yaml and a policy (azure, falling back to local); the runner playing Azure ML meanwhile."""
    monkeypatch.setenv("PYTHONPATH", ":".join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    (tm_home / "config").mkdir(parents=True)
    section = {k: v for k, v in azure_config.model_dump(exclude_defaults=True).items()}
    (tm_home / "config" / "backends.yaml").write_text(json.dumps({"azure": {**section, "region": "eastus"}}))
    (tmp_path / "policy.yaml").write_text("name: az\ndefault:\n  primary: azure\n  fallbacks: [local]\n")
    with AzureMLRunner(azure, tmp_path / "service", test_image) as runner:
        yield runner


def job(tmp_path, entrypoint: str, *, name="lm", text=None, files=None):
    """A job folder: the tiny LM's job.yaml (or `text`) with its evaluator, and `files`."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "job.yaml").write_text(text or JOB.format(entrypoint=entrypoint))
    (folder / "evaluate.py").write_text(EVALUATOR)
    for file, text in (files or {}).items():
        (folder / file).write_text(text)
    return folder / "job.yaml"


def submit(spec, tmp_path) -> dict:
    done = tm("submit", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--wait", "--json")
    return shown(done)


def billed(azure, name: str) -> float:
    """What the job resource documents of its run: from its creation to its last change (it ended), in seconds."""
    from datetime import datetime

    system = azure.fake.jobs[name]["systemData"]
    ended, created = (datetime.fromisoformat(system[key]) for key in ("lastModifiedAt", "createdAt"))
    return (ended - created).total_seconds()


def synced_log(tmp_path, name: str) -> str:
    """The job's log as the launcher published it in the mounted synced folder (closed parts, by offset)."""
    parts = sorted((tmp_path / "service" / name / "outputs" / "sync" / "log").glob("*.log"))
    return "".join(p.read_text() for p in parts)


def stored(azure, container: str, prefix: str) -> int:
    from azure.storage.blob import BlobServiceClient

    blobs = BlobServiceClient.from_connection_string(azure.azurite.connection_string).get_container_client(container)
    return sum(b.size for b in blobs.list_blobs(name_starts_with=prefix))


def expected_cost(azure, azure_config, attempt: dict, price: int) -> int:
    """The price recorded at dispatch × the seconds the service billed × 1 instance, plus the estimated egress
    of the outputs and a month of storing the synced folder (backends/managed/backend.py)."""
    from trainmaster.backends.catalog.transfer import EGRESS_MICRO_USD_PER_GB

    name, sync = job_name(attempt["id"]), f"trainmaster/attempts/{attempt['id']}/sync/"
    compute = -(-int(billed(azure, name) * 1000) * price // 3_600_000)
    outputs = stored(azure, azure_config.container, sync + "outputs/")
    egress = -(-outputs * EGRESS_MICRO_USD_PER_GB["azure"] // 10**9)
    return compute + egress + -(-stored(azure, azure_config.container, sync) * 23_000 // 10**9)


def test_a_preempted_spot_run_resumes_to_an_uninterrupted_runs_bytes_and_is_verified_and_charged(
        cli, azure, azure_config, tm_home, tmp_path):
    """Preempted mid-run (segment 2 on disk), and reclaimed after its entrypoint exited 0 while Azure ML was still
    finalizing the job (the service says Failed; the exit record says 0): both times the job resumes from its synced
    segments to the bytes of an uninterrupted run, is verified and charged each attempt as billed."""
    plain = submit(job(tmp_path, "", name="plain", text=short_job()), tmp_path)  # 4 segments of 10 steps
    assert plain["state"] == "accepted", plain
    uninterrupted = {f["path"]: f["sha256"] for f in plain["attempts"][0]["outputs"]}["model.safetensors"]

    cli.preempt_at_segment = 2
    resumed_to(uninterrupted, submit(job(tmp_path, "", text=short_job()), tmp_path), azure, azure_config, tm_home,
               tmp_path)
    cli.reclaim_after_exit = True
    finished = submit(job(tmp_path, "", name="finished", text=short_job()), tmp_path)
    resumed_to(uninterrupted, finished, azure, azure_config, tm_home, tmp_path)
    assert [cli.exit_codes[job_name(a["id"])] for a in finished["attempts"]] == [[0], [0]]
    sent = [json.loads(body)["properties"] for method, path, body in azure.fake.log
            if method == "PUT" and "/jobs/" in path]
    assert [p["queueSettings"]["jobTier"] for p in sent] == ["Spot"] * 5


def resumed_to(uninterrupted: str, done: dict, azure, azure_config, tm_home, tmp_path) -> None:
    """The job was preempted once, resumed from its synced segments on azure, accepted with the uninterrupted run's
    model, and charged each attempt what the service billed; `status` and `logs` show it."""
    assert done["state"] == "accepted", json.dumps(done, indent=1)  # whole: each attempt's state and reason
    first, second = done["attempts"]
    assert first["backend"] == second["backend"] == "azure"
    assert first["state"] != "accepted" and "preempted" in first["reason"], first
    assert second["state"] == "accepted", second
    assert {f["path"]: f["sha256"] for f in second["outputs"]}["model.safetensors"] == uninterrupted
    resumed = synced_log(tmp_path, job_name(second["id"]))
    assert "resum" in resumed.lower(), resumed  # from the segments carried into its synced folder

    status = shown(tm("status", done["id"], "--json"))
    assert status["state"] == "accepted"
    logs = tm("logs", done["id"])
    assert logs.returncode == 0 and "final_sha256" in logs.stdout, logs.stdout + logs.stderr

    for attempt in (first, second):
        [offer] = state_rows(tm_home, "SELECT offer_json FROM attempts WHERE id = ?", attempt["id"])
        price = json.loads(offer["offer_json"])["price_per_hour_micro_usd"]
        assert attempt["cost_micro_usd"] == expected_cost(azure, azure_config, attempt, price), attempt
    charges = state_rows(tm_home,
                         "SELECT micro_usd FROM ledger_entries WHERE job_id = ? AND kind = 'charge'", done["id"])
    charged = first["cost_micro_usd"] + second["cost_micro_usd"]
    assert sum(c["micro_usd"] for c in charges) == charged == status["cost_micro_usd"]


def test_a_two_node_gloo_job_runs_on_two_instances(cli, azure, tmp_path):
    spec = job(tmp_path, "", name="gloo", files={"gloo.py": GLOO},
               text="name: gloo\nentrypoint: python gloo.py\nresources:\n  nodes: 2\n")
    done = submit(spec, tmp_path)
    assert done["state"] == "accepted", done
    [attempt] = done["attempts"]
    name = job_name(attempt["id"])
    props = azure.fake.properties(name)
    assert props["resources"]["instanceCount"] == 2
    assert props["distribution"] == {"processCountPerInstance": 1, "distributionType": "PyTorch"}
    assert cli.exit_codes[name] == [0, 0]
    logs = [(tmp_path / "service" / name / f"node{i}.log").read_text() for i in range(2)]
    assert "rank 0 of 2: sum 3" in logs[0] and "rank 1 of 2: sum 3" in logs[1], logs
    assert {f["path"] for f in attempt["outputs"]} >= {"sum.txt"}, attempt


def test_throttling_and_5xx_are_retried_until_the_job_runs(cli, azure, tmp_path):
    azure.fake.faults.extend([("GET", 429, "TooManyRequests", "slow down")]
                             + [("PUT", 503, "ServiceUnavailable", "busy")] * 5)  # past the SDK's own 3 retries
    done = submit(job(tmp_path, TINY_LM.format(steps=25)), tmp_path)
    assert done["state"] == "accepted", done
    [attempt] = done["attempts"]
    assert attempt["backend"] == "azure"
    answered = [path for method, path, _ in azure.fake.log if method == "PUT" and "/jobs/" in path]
    assert len(answered) == 6 and len(azure.fake.jobs) == 1  # five refused, then created once


def test_a_quota_refused_at_submit_ends_azure_once_and_falls_back_to_local(cli, azure, tm_home, tmp_path):
    """A quota is the set-up's, not the offer's: the azure attempt ends once with the service's words, azure is not
    planned again for the job (no loop over its other offers), and the policy's fallback runs it."""
    azure.fake.refusing = "InsufficientQuota: the subscription has no quota for NCASv3_T4 in eastus"
    done = submit(job(tmp_path, TINY_LM.format(steps=25)), tmp_path)
    assert done["state"] == "accepted", done
    refused, ran = done["attempts"]
    assert ran["backend"] == "local" and ran["state"] == "accepted"
    assert refused["backend"] == "azure" and refused["state"] == "failed", refused
    assert "InsufficientQuota: the subscription has no quota for NCASv3_T4 in eastus" in refused["reason"], refused
    [ended] = [json.loads(e["detail"]) for e in state_rows(tm_home, "SELECT detail FROM events WHERE attempt_id = ? "
                                                              "AND kind = 'attempt' AND to_state = 'failed'",
                                                              refused["id"])]
    assert ended["cause"] == "misconfigured", ended
    assert azure.fake.jobs == {}


def test_a_job_failing_in_the_service_ends_with_its_reason_and_exit_code(cli, azure, tm_home, tmp_path):
    done = submit(job(tmp_path, "python fail.py", name="fails", files={"fail.py": FAILING}), tmp_path)
    assert done["state"] == "failed", done
    [attempt] = done["attempts"]
    name = job_name(attempt["id"])
    assert azure.fake.properties(name)["status"] == "Failed" and cli.exit_codes[name] == [3]
    assert attempt["state"] == "failed" and attempt["reason"] == "exited with code 3: about to fail", attempt
    ended = [json.loads(e["detail"]) for e in state_rows(tm_home, "SELECT detail FROM events WHERE attempt_id = ? AND "
                                                            "kind = 'attempt' AND detail IS NOT NULL", attempt["id"])]
    assert ended == [{"cause": "script_failed", "reason": "exited with code 3: about to fail"}]  # no fallback


def test_cancel_stops_the_azure_ml_job(cli, azure, tmp_path):
    spec = job(tmp_path, "", name="long", files={"train.py": "import time\nprint('started', flush=True)\n"
                                                             "time.sleep(120)\n"},
               text="name: long\nentrypoint: python train.py\n")
    submitted = shown(tm("submit", str(spec), "--policy", str(tmp_path / "policy.yaml"), "--json"))
    deadline = time.monotonic() + 60
    while not any(j["properties"]["status"] == "Running" for j in azure.fake.jobs.values()):
        assert time.monotonic() < deadline, "the job never started"
        tm("status", submitted["id"], "--json")  # the broker moves it along as it is asked
        time.sleep(0.2)
    cancelled = tm("cancel", submitted["id"], "--json")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    [name] = azure.fake.jobs
    while azure.fake.properties(name)["status"] != "Canceled":  # the runner saw CancelRequested and stopped it
        assert time.monotonic() < deadline, azure.fake.properties(name)["status"]
        time.sleep(0.2)
    assert cli.exit_codes[name] == [-9]
    final = shown(tm("status", submitted["id"], "--json"))
    assert final["state"] == "cancelled" and [a["state"] for a in final["attempts"]] == ["cancelled"], final

"""Each service's variables and files as the launcher reads them (jobs/services.py), one node of each run for real,
and two-node gloo runs on 127.0.0.1 (two launcher processes: SageMaker hosts from resourceconfig.json, and a Vertex
CLUSTER_SPEC) that end with rank 0's outputs alone in the synced folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from launcher_support import launch, make_bundle, plan, read_json, sagemaker_instance, start, synced_log

from trainmaster.jobs.launch_command import free_port
from trainmaster.jobs.launch_plan import LaunchPlan
from trainmaster.jobs import services
from trainmaster.jobs.services import PlacementError, place

SHA = "a" * 64
WRITE = ("import os, pathlib\nout = pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'])\n"
         "(out / 'answer.txt').write_text(os.environ['TRAINMASTER_JOB_ID'])\nprint('wrote the answer')\n")
GLOO = """\
import os, pathlib
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1])
dist.all_reduce(total)
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], f"rank{dist.get_rank()}.txt").write_text(str(int(total)))
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum {int(total)}", flush=True)
dist.destroy_process_group()
"""


def _plan(service: str, **fields) -> LaunchPlan:
    return LaunchPlan(service=service, entrypoint="python x.py", bundle_sha256=SHA, **fields)


def _channel(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True)
    for name in names:
        (folder / name).write_bytes(b"tar")
    return folder


@pytest.fixture
def opt_ml(tmp_path, monkeypatch):
    """An instance's /opt/ml for `place` (the launcher's knowledge of SageMaker's paths, pointed at a folder)."""
    def make(hosts=("algo-1", "algo-2", "algo-3"), current="algo-3", files=("b.tar",)) -> Path:
        root = sagemaker_instance(tmp_path / current, _channel(tmp_path / f"ch-{current}", *files), hosts=hosts,
                                  current=current)
        monkeypatch.setattr(services, "OPT_ML_ROOT", root)
        return root
    return make


def test_sagemaker_hosts_come_from_resourceconfig_json(opt_ml):
    """With a ContainerEntrypoint SageMaker sets no SM_* variables: the hosts and this one are in
    /opt/ml/input/config/resourceconfig.json, and node 0 (where torchrun meets) is algo-1 on every host."""
    root = opt_ml(hosts=("algo-3", "algo-1", "algo-10", "algo-2"), current="algo-3")
    where = place(_plan("sagemaker", master_port=29999), {})
    assert (where.bundle, where.sync, where.model_dir) == (root / "input" / "data" / "bundle" / "b.tar",
                                                           root / "checkpoints", root / "model")
    assert (where.nnodes, where.node_rank, where.master_addr, where.master_port) == (4, 2, "algo-1", 29999)
    assert place(_plan("sagemaker", sync="/s"), {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "7777"}).sync == Path("/s")
    moved = place(_plan("sagemaker"), {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "7777"})
    assert (moved.master_addr, moved.master_port) == ("10.0.0.9", 7777)  # the service's own win
    assert place(_plan("sagemaker"), {"SM_HOSTS": '["x"]', "SM_CURRENT_HOST": "x"}).nnodes == 4  # not SM_*


@pytest.mark.parametrize("config, said", [
    ({"hosts": ["algo-1"], "current_host": "algo-2"}, "is not one of its hosts"),
    ({"hosts": "algo-1", "current_host": "algo-1"}, "hosts is not a list"),
    ({"hosts": [], "current_host": "algo-1"}, "hosts is not a list"),
    (None, "resourceconfig.json cannot be read"),
])
def test_a_resourceconfig_that_does_not_place_the_node_is_refused(opt_ml, config, said):
    root = opt_ml()
    path = root / "input" / "config" / "resourceconfig.json"
    path.unlink()
    if config is not None:
        path.write_text(json.dumps(config))
    with pytest.raises(PlacementError, match=said):
        place(_plan("sagemaker"), {})


def test_a_channel_not_holding_one_file_is_refused(opt_ml):
    opt_ml(files=("a", "b"))
    with pytest.raises(PlacementError, match="holds 2 files"):
        place(_plan("sagemaker"), {})
    with pytest.raises(PlacementError, match="MASTER_PORT is not a number"):
        place(_plan("sagemaker", bundle="/b.tar"), {"MASTER_PORT": "http"})


def test_vertex_reads_buckets_through_the_mount_and_ranks_from_the_cluster_spec():
    cluster = {"cluster": {"workerpool0": ["cmle-0:2222"], "workerpool1": ["w-0:2222", "w-1:2222"]},
               "task": {"type": "workerpool1", "index": 1}}
    env = {"TRAINMASTER_GCS_MOUNT": "/mnt/gcs", "AIP_CHECKPOINT_DIR": "gs://bk/jobs/a1/sync",
           "AIP_MODEL_DIR": "gs://bk/jobs/a1/model", "CLUSTER_SPEC": json.dumps(cluster)}
    where = place(_plan("vertex", bundle="gs://bk/bundles/x.tar"), env)
    assert where.bundle == Path("/mnt/gcs/bk/bundles/x.tar")
    assert (where.sync, where.model_dir) == (Path("/mnt/gcs/bk/jobs/a1/sync"), Path("/mnt/gcs/bk/jobs/a1/model"))
    assert (where.nnodes, where.node_rank, where.master_addr, where.master_port) == (3, 2, "cmle-0", 2222)
    lead = place(_plan("vertex", bundle="gs://bk/x.tar"),
                 {**env, "CLUSTER_SPEC": json.dumps({**cluster, "task": {"type": "workerpool0", "index": 0}})})
    assert lead.node_rank == 0
    alone = place(_plan("vertex", bundle="gs://bk/x.tar", master_port=29555), {"AIP_CHECKPOINT_DIR": "gs://bk/s"})
    assert (alone.nnodes, alone.node_rank, alone.sync, alone.master_port) == (1, 0, Path("/gcs/bk/s"), 29555)
    portless = {"cluster": {"workerpool0": ["cmle-0"]}, "task": {"type": "workerpool0", "index": 0}}
    named = place(_plan("vertex", bundle="gs://bk/x.tar", master_port=29555), {**env, "CLUSTER_SPEC": json.dumps(portless)})
    assert (named.nnodes, named.master_addr, named.master_port) == (1, "cmle-0", 29555)


@pytest.mark.parametrize("plan_fields, env, said", [
    ({}, {"AIP_CHECKPOINT_DIR": "gs://bk/s"}, "names no bundle"),
    ({"bundle": "gs://bk/x.tar"}, {}, "AIP_CHECKPOINT_DIR"),
    ({"bundle": "gs://bk/x.tar"}, {"AIP_CHECKPOINT_DIR": "gs://bk/s", "CLUSTER_SPEC": '{"cluster": {}}'}, "workerpool0"),
])
def test_vertex_without_what_it_needs_is_refused(plan_fields, env, said):
    with pytest.raises(PlacementError, match=said):
        place(_plan("vertex", **plan_fields), env)


def test_azureml_takes_its_inputs_and_the_rendezvous_of_its_pytorch_distribution(tmp_path):
    folder = _channel(tmp_path / "in", "bundle.tar")
    env = {"AZURE_ML_INPUT_bundle": str(folder), "AZURE_ML_OUTPUT_sync": str(tmp_path / "out"),
           "MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "6105", "NODE_RANK": "1"}
    where = place(_plan("azureml", nodes=2), env)
    assert (where.bundle, where.sync, where.model_dir) == (folder / "bundle.tar", tmp_path / "out", None)
    assert (where.nnodes, where.node_rank, where.master_addr, where.master_port) == (2, 1, "10.0.0.4", 6105)
    assert place(_plan("azureml", nodes=2), {**env, "AZURE_ML_INPUT_bundle": str(folder / "bundle.tar")}).bundle == \
        folder / "bundle.tar"
    with pytest.raises(PlacementError, match="outside the job's 2 node"):
        place(_plan("azureml", nodes=2), {**env, "NODE_RANK": "2"})
    with pytest.raises(PlacementError, match="AZURE_ML_OUTPUT_sync"):
        place(_plan("azureml"), {"AZURE_ML_INPUT_bundle": str(folder)})


def test_vertex_runs_a_job_from_the_mounted_bucket(tmp_path):
    bundle, digest = make_bundle(tmp_path / "in", {"write.py": WRITE}, "python write.py")
    mount = tmp_path / "gcs"
    (mount / "bk" / "bundles").mkdir(parents=True)
    bundle.rename(mount / "bk" / "bundles" / "x.tar")
    env = {"TRAINMASTER_GCS_MOUNT": str(mount), "AIP_CHECKPOINT_DIR": "gs://bk/a1/sync",
           "AIP_MODEL_DIR": "gs://bk/a1/model"}
    done = launch(plan("vertex", "python write.py", digest, bundle="gs://bk/bundles/x.tar"), env, tmp_path / "tmp")
    assert done.returncode == 0, done.stdout + done.stderr
    sync = mount / "bk" / "a1" / "sync"
    assert read_json(sync / "exit.json")["reason"] == "exited with code 0: wrote the answer"
    assert set(read_json(sync / "outputs.json")["files"]) == {"answer.txt"}
    assert (mount / "bk" / "a1" / "model" / "answer.txt").read_text() == "job-launcher"


def test_azureml_runs_a_job_from_its_input_folder(tmp_path):
    bundle, digest = make_bundle(tmp_path / "in", {"write.py": WRITE}, "python write.py")
    env = {"AZURE_ML_INPUT_bundle": str(bundle.parent), "AZURE_ML_OUTPUT_sync": str(tmp_path / "sync")}
    done = launch(plan("azureml", "python write.py", digest), env, tmp_path / "tmp")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "sync" / "outputs" / "answer.txt").read_text() == "job-launcher"
    assert read_json(tmp_path / "sync" / "exit.json")["exit_code"] == 0
    assert "wrote the answer" in synced_log(tmp_path / "sync")


def _two_nodes(tmp_path: Path, launch_json: str, node_envs: list[dict], opt_mls=(None, None), hosts=()) -> list[str]:
    """Start one launcher per node, wait for both; each one's output."""
    procs = [start(launch_json, env, tmp_path / f"tmp{i}", tmp_path / f"node{i}.out", opt_ml=opt_mls[i], hosts=hosts)
             for i, env in enumerate(node_envs)]
    try:
        codes = [p.wait(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    outs = [(tmp_path / f"node{i}.out").read_text() for i in range(len(procs))]
    assert codes == [0, 0], outs
    return outs


@pytest.mark.slow
def test_two_sagemaker_hosts_run_one_gloo_job_with_rank_0s_outputs_alone(tmp_path):
    """Each instance with its own /opt/ml and SageMaker's host names (resolving to 127.0.0.1 here): placed from
    resourceconfig.json alone, node 1 meets node 0 at algo-1."""
    bundle, digest = make_bundle(tmp_path / "in", {"gloo.py": GLOO}, "python gloo.py")
    launch_json = plan("sagemaker", "python gloo.py", digest, nodes=2, master_port=free_port())
    hosts = ("algo-1", "algo-2")
    opt_mls = [sagemaker_instance(tmp_path / host, bundle.parent, hosts=hosts, current=host) for host in hosts]
    outs = _two_nodes(tmp_path, launch_json, [{}, {}], opt_mls, hosts)
    assert "rank 1 of 2: sum 3" in outs[1] and "--node-rank=1" in outs[1] and "--master-addr=algo-1" in outs[1]
    sync = opt_mls[0] / "checkpoints"
    assert set(read_json(sync / "outputs.json")["files"]) == {"rank0.txt"}
    assert (sync / "outputs" / "rank0.txt").read_text() == "3"
    assert "rank 0 of 2: sum 3" in synced_log(sync)
    assert not (opt_mls[1] / "checkpoints" / "exit.json").exists()  # node 1 records nothing


@pytest.mark.slow
def test_a_vertex_cluster_spec_runs_one_gloo_job_across_two_launchers(tmp_path):
    bundle, digest = make_bundle(tmp_path / "in", {"gloo.py": GLOO}, "python gloo.py")
    mount = tmp_path / "gcs"
    (mount / "bk").mkdir(parents=True)
    bundle.rename(mount / "bk" / "x.tar")
    launch_json = plan("vertex", "python gloo.py", digest, nodes=2, bundle="gs://bk/x.tar")
    pools = {"workerpool0": [f"127.0.0.1:{free_port()}"], "workerpool1": ["127.0.0.1:2222"]}
    tasks = [{"type": "workerpool0", "index": 0}, {"type": "workerpool1", "index": 0}]
    envs = [{"TRAINMASTER_GCS_MOUNT": str(mount), "AIP_CHECKPOINT_DIR": "gs://bk/sync",
             "CLUSTER_SPEC": json.dumps({"cluster": pools, "task": task})} for task in tasks]
    _two_nodes(tmp_path, launch_json, envs)
    sync = mount / "bk" / "sync"  # one mounted bucket: node 1 sees it, and writes nothing of its own there
    assert set(read_json(sync / "outputs.json")["files"]) == {"rank0.txt"}
    assert (sync / "outputs" / "rank0.txt").read_text() == "3"
    assert read_json(sync / "exit.json")["exit_code"] == 0


def test_ray_takes_the_bundle_from_the_working_dir_and_the_ranks_from_a_ray_train_worker(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Ray starts the launcher in the job's working directory
    ranks = {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "1",
             "GROUP_RANK": "1", "ROLE_RANK": "1", "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "4000"}
    worker = {**ranks, "TRAINMASTER_RAY_TRAIN_WORKER": "1", "OTHER": "x"}
    where = place(_plan("ray", nodes=2, bundle="bundle.tar", sync="/shared/attempts/a1"), worker)
    assert (where.bundle, where.sync, where.model_dir) == (tmp_path / "bundle.tar", Path("/shared/attempts/a1"), None)
    assert (where.nnodes, where.node_rank, where.master_addr, where.master_port) == (2, 1, "10.0.0.5", 4000)
    assert where.ranks == ranks and not where.lead  # rank 1 keeps nothing in the synced folder
    lead = place(_plan("ray", nodes=2, bundle="b", sync="/s"), {**worker, "RANK": "0", "NODE_RANK": "0"})
    assert lead.lead and lead.node_rank == 0
    spans = place(_plan("ray", bundle="b", sync="/s"), worker)  # GPUs beyond one node: a one-node job spans two
    assert (spans.nnodes, spans.node_rank) == (2, 1)
    alone = place(_plan("ray", bundle="bundle.tar", sync="/s"), {})
    assert (alone.nnodes, alone.node_rank, alone.ranks, alone.lead) == (1, 0, {}, True)
    with pytest.raises(PlacementError, match="Ray: the plan names no synced folder"):
        place(_plan("ray", bundle="bundle.tar"), {})
    with pytest.raises(PlacementError, match="Ray Train worker: LOCAL_WORLD_SIZE not set"):
        place(_plan("ray", bundle="b", sync="/s"), {k: v for k, v in worker.items() if k != "LOCAL_WORLD_SIZE"})
    with pytest.raises(PlacementError, match="RANK is not a number"):
        place(_plan("ray", bundle="b", sync="/s"), {**worker, "RANK": "one"})


@pytest.mark.slow
def test_two_ray_train_workers_launchers_run_one_gloo_job_directly_with_their_ranks(tmp_path):
    bundle, digest = make_bundle(tmp_path / "in", {"gloo.py": GLOO}, "python gloo.py")
    sync = tmp_path / "shared" / "a1"
    launch_json = plan("ray", "python gloo.py", digest, nodes=2, bundle=str(bundle), sync=str(sync))
    port = str(free_port())
    envs = [{"TRAINMASTER_RAY_TRAIN_WORKER": "1", "RANK": str(r), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
             "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(r), "GROUP_RANK": str(r), "ROLE_RANK": str(r),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port} for r in range(2)]
    outs = _two_nodes(tmp_path, launch_json, envs)
    assert "node 1 of 2, process 1 of 2" in outs[1] and "rank 1 of 2: sum 3" in outs[1], outs[1]
    assert "torch.distributed.run" not in outs[0] + outs[1]  # each launcher runs its one process directly
    assert set(read_json(sync / "outputs.json")["files"]) == {"rank0.txt"}
    assert "rank 0 of 2: sum 3" in (sync / "job.log").read_text()

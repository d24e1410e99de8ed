"""The container launcher (`python -m trainmaster.jobs.launcher`) on one node, the test playing SageMaker (the
instance's own /opt/ml, clouds/namespace.py): a real job's outputs, manifest and exit record in the synced folder
(published there as closed files, the log as parts); a failing job's code and last line; a bundle refused before
anything runs; a bad plan; a resume from the synced checkpoints; SIGTERM passed to the job."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from launcher_support import TINY_LM, launch, make_bundle, plan, read_json, sagemaker_instance, start, synced_log

SLEEPER = """\
import os, pathlib, time
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "pid").write_text(str(os.getpid()))
print("job started", flush=True)
time.sleep(120)
"""


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _says(sync, text: str) -> bool:
    return text in synced_log(sync)


def _run(tmp_path, entrypoint: str, files: dict | None = None, *, sha256: str | None = None, sync=None,
         env: dict | None = None):
    bundle, digest = make_bundle(tmp_path / "in", files or {}, entrypoint)
    opt_ml = sagemaker_instance(tmp_path, bundle.parent)
    done = launch(plan("sagemaker", entrypoint, sha256 or digest, **({"sync": str(sync)} if sync else {})), env or {},
                  tmp_path / "tmp", opt_ml=opt_ml)
    return done, tmp_path / "opt_ml" / "checkpoints"


@pytest.mark.slow
def test_a_tiny_real_job_completes_with_its_outputs_manifest_and_exit_record(tmp_path):
    done, sync = _run(tmp_path, TINY_LM)
    assert done.returncode == 0, done.stdout + done.stderr
    ended = read_json(sync / "exit.json")
    assert ended["exit_code"] == 0 and ended["reason"].startswith("exited with code 0")
    assert ended["started_at"] <= ended["ended_at"]
    files = read_json(sync / "outputs.json")["files"]
    assert {"result.json", "commitment.json", "model.safetensors", "metrics.jsonl"} <= set(files)
    for name, entry in files.items():
        assert entry == {"size": (sync / "outputs" / name).stat().st_size, "sha256": _sha256(sync / "outputs" / name)}
        assert _sha256(tmp_path / "opt_ml" / "model" / name) == entry["sha256"]  # copied into SM_MODEL_DIR
    assert sorted(p.name for p in (sync / "checkpoints" / "segments").iterdir()) == ["00000000", "00000001", "00000002"]
    log = synced_log(sync)
    assert '"final_sha256"' in log and '"final_sha256"' in done.stdout  # the job's output, in the log and on stdout
    assert not (sync / "job.log").exists()  # on an object-store mount: closed parts, never a held-open file
    assert list((tmp_path / "tmp").glob("trainmaster-*")) == []  # the unpacked bundle is removed


def test_a_failing_entrypoint_gives_its_exit_code_and_last_line(tmp_path):
    script = "import sys\nprint('loading data')\nprint('ValueError: no such column', file=sys.stderr)\nsys.exit(3)\n"
    done, sync = _run(tmp_path, "python fail.py", {"fail.py": script})
    assert done.returncode == 3
    ended = read_json(sync / "exit.json")
    assert ended["exit_code"] == 3
    assert ended["reason"] == "exited with code 3: ValueError: no such column"
    assert read_json(sync / "outputs.json") == {"files": {}}
    assert "loading data" in synced_log(sync)


def test_a_wrong_sha256_is_refused_before_anything_runs(tmp_path):
    script = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'ran').write_text('yes')\n"
    done, sync = _run(tmp_path, "python job.py", {"job.py": script}, sha256="0" * 64)
    assert done.returncode == 2
    ended = read_json(sync / "exit.json")
    assert ended["exit_code"] == 2 and "the bundle is refused" in ended["reason"] and "sha256" in ended["reason"]
    assert not (sync / "outputs" / "ran").exists()
    assert "$ python job.py" not in synced_log(sync)


def test_a_python_without_tarfiles_extraction_filters_is_refused_with_the_python_it_needs(tmp_path):
    """As in an image whose Python predates PEP 706 (3.10.8, or Debian 12's own 3.11.2): tarfile has no
    extraction filters there (made so here by a sitecustomize), and the launcher refuses before anything runs,
    saying which Python it needs, instead of failing on a missing attribute."""
    old_python = tmp_path / "old-python"
    old_python.mkdir()
    (old_python / "sitecustomize.py").write_text("import tarfile\ndel tarfile.data_filter, tarfile.FilterError\n")
    script = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'ran').write_text('yes')\n"
    path = os.pathsep.join(filter(None, [str(old_python), os.environ.get("PYTHONPATH")]))
    done, sync = _run(tmp_path, "python job.py", {"job.py": script}, env={"PYTHONPATH": path})
    assert done.returncode == 2, done.stdout + done.stderr
    reason = read_json(sync / "exit.json")["reason"]
    assert "has no tarfile extraction filters (PEP 706)" in reason and "3.10.12+, 3.11.4+ or 3.12+" in reason, reason
    assert "Traceback" not in done.stdout + done.stderr and "AttributeError" not in reason
    assert not (sync / "outputs" / "ran").exists() and "$ python job.py" not in synced_log(sync)


@pytest.mark.parametrize("launch_json, said", [
    (None, "neither TRAINMASTER_LAUNCH_FILE nor TRAINMASTER_LAUNCH is set"),
    ("{not json", "is not a launch plan"),
    (json.dumps({"service": "lambda", "entrypoint": "python x.py", "bundle_sha256": "0" * 64}), "service"),
    (json.dumps({"service": "sagemaker", "entrypoint": "python x.py", "bundle_sha256": "0" * 64, "extra": 1}), "extra"),
])
def test_a_bad_plan_exits_2_and_says_why(tmp_path, launch_json, said):
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINMASTER_LAUNCH", "TRAINMASTER_LAUNCH_FILE")}
    if launch_json is not None:
        env["TRAINMASTER_LAUNCH"] = launch_json
    done = subprocess.run([sys.executable, "-m", "trainmaster.jobs.launcher"], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert said in done.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_the_direct_launcher_refuses_a_job_of_several_nodes(tmp_path):
    bundle, digest = make_bundle(tmp_path / "in", {}, "python -c 'print(1)'")
    opt_ml = sagemaker_instance(tmp_path, bundle.parent, hosts=("algo-1", "algo-2"))
    done = launch(plan("sagemaker", "python -c 'print(1)'", digest, launcher="direct", nodes=2), {}, tmp_path / "tmp",
                  opt_ml=opt_ml, hosts=("algo-1", "algo-2"))
    assert done.returncode == 2
    assert "the launcher 'direct' runs one process; this job has 2 nodes" in done.stderr
    assert list((opt_ml / "checkpoints").iterdir()) == []


def test_links_in_the_outputs_are_left_out_of_the_manifest_and_the_model_dir(tmp_path):
    entrypoint = "bash -c 'echo weights > $TRAINMASTER_OUTPUT_DIR/w.bin; ln -s /etc/hostname $TRAINMASTER_OUTPUT_DIR/link'"
    done, sync = _run(tmp_path, entrypoint)
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(read_json(sync / "outputs.json")["files"]) == {"w.bin"}
    assert sorted(p.name for p in (tmp_path / "opt_ml" / "model").iterdir()) == ["w.bin"]


def test_sigterm_to_the_launcher_stops_the_job(tmp_path):
    bundle, digest = make_bundle(tmp_path / "in", {"sleep.py": SLEEPER}, "python sleep.py")
    sync = tmp_path / "opt_ml" / "checkpoints"
    proc = start(plan("sagemaker", "python sleep.py", digest), {}, tmp_path / "tmp", tmp_path / "launcher.out",
                 opt_ml=sagemaker_instance(tmp_path, bundle.parent))
    try:
        deadline = time.time() + 60
        while not (_says(sync, "job started") and (sync / "outputs" / "pid").exists()):
            assert time.time() < deadline and proc.poll() is None, (tmp_path / "launcher.out").read_text()
            time.sleep(0.1)
        pid = int((sync / "outputs" / "pid").read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    ended = read_json(sync / "exit.json")
    assert ended["exit_code"] == 128 + signal.SIGTERM
    assert ended["reason"].startswith("stopped by SIGTERM sent to the launcher; killed by SIGTERM")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.slow
def test_a_synced_folder_holding_segments_resumes_to_the_same_final_state(tmp_path):
    first, sync = _run(tmp_path / "whole", TINY_LM)
    assert first.returncode == 0, first.stdout + first.stderr
    whole = read_json(sync / "outputs" / "result.json")["final_sha256"]

    restored = tmp_path / "restored"  # what a service restart restores, or the broker copies from an earlier attempt
    for segment in ("00000000", "00000001"):
        shutil.copytree(sync / "checkpoints" / "segments" / segment, restored / "checkpoints" / "segments" / segment)
    (restored / "checkpoints" / "segments" / "00000002.tmp").mkdir()  # half-written by the kill: not a segment
    (restored / "outputs").mkdir()
    shutil.copyfile(sync / "outputs" / "metrics.jsonl", restored / "outputs" / "metrics.jsonl")
    again, _ = _run(tmp_path / "again", TINY_LM, sync=restored)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed at step 25 of 50" in synced_log(restored)
    assert read_json(restored / "outputs" / "result.json")["final_sha256"] == whole
    assert read_json(restored / "exit.json")["exit_code"] == 0


def test_the_launcher_does_not_import_torch():
    code = "import sys, trainmaster.jobs.launcher; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr

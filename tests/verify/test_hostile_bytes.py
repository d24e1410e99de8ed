"""Bounded work on hostile bytes (issue #24): what an executor leaves in its outputs is refused by name
and reason, quickly, never followed, never blocking, never echoed, and never as "cannot verify".

Through the CLI: `trainmaster verify DIR --json` as a subprocess (with a timeout, so a hang fails),
and `submit --wait` for jobs that leave a FIFO, a huge commitment, or a step of 10**400 for the live
status line. Unit tests pin the bounded reader, the walk's limits, the zip budget and the numbers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

import hostile_support as hostile
from trainmaster.broker.cli.live import duration
from trainmaster.broker.job_progress import last_step
from trainmaster.jobs import output_tree
from trainmaster.jobs.files import HostileFile, read_regular, read_tail, sha256_file
from trainmaster.verify import output_kinds, zip_bounds
from trainmaster.verify.archive_child import classify_archives
from trainmaster.verify.errors import VerificationError
from trainmaster.verify.outcome import check_outcome
from trainmaster.verify.output_kinds import HOSTILE, UNCHECKED, classify

GB = 10**9


def verify_dir(outputs: Path, *extra: str) -> tuple[dict, str]:
    """`trainmaster verify OUTPUTS --json`: the verdict and everything the process printed."""
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "verify", str(outputs), "--json", *extra],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1, 2), done.stderr
    return json.loads(done.stdout), done.stdout + done.stderr


def rejected_for(outputs: Path, *extra: str) -> str:
    """The reasons of a verdict that must be `rejected` (never cannot_verify), joined."""
    verdict, printed = verify_dir(outputs, *extra)
    assert verdict["outcome"] == "rejected", printed
    return " ".join(verdict["reasons"])


@pytest.fixture
def outputs(tmp_path) -> Path:
    return hostile.outputs(tmp_path / "outputs")


# commitment.json and result.json: a size limit checked before reading, links never followed


@pytest.mark.parametrize("size", [3 * GB, 50 * GB])
def test_a_huge_sparse_commitment_is_rejected_by_its_size(outputs, size):
    hostile.sparse(outputs / "commitment.json", size)
    reasons = rejected_for(outputs)
    assert f"commitment.json: is {size} bytes, over the limit of 4096 bytes" in reasons


def test_a_commitment_of_a_few_kb_too_many_is_rejected_without_echoing_it(outputs):
    (outputs / "commitment.json").write_text('{"job_id": "' + "A" * 5000 + '"}')
    reasons = rejected_for(outputs)
    assert "over the limit" in reasons and "AAAA" not in reasons


def test_a_malformed_commitment_is_rejected_without_echoing_its_bytes(outputs):
    (outputs / "commitment.json").write_text(json.dumps({"job_id": hostile.SECRET, "k": 1}))
    verdict, printed = verify_dir(outputs)
    assert verdict["outcome"] == "rejected" and "malformed commitment" in " ".join(verdict["reasons"])
    assert "wJalrXUtnFEMI" not in printed


@pytest.mark.parametrize("size", [3 * GB, 64 * 2**20])
def test_a_huge_result_json_is_rejected_by_its_size(outputs, size):
    hostile.sparse(outputs / "result.json", size)
    reasons = rejected_for(outputs, "--trusted")
    assert f"result.json is {size} bytes, over the limit of" in reasons


def test_a_huge_result_json_read_for_thresholds_is_rejected_not_cannot_verify(outputs):
    hostile.sparse(outputs / "result.json", 3 * GB)
    with pytest.raises(VerificationError) as raised:
        check_outcome(outputs / "model.safetensors", thresholds={"score": 1.0}, outputs=outputs, trust_reported=True)
    assert raised.value.kind == "rejected" and "result.json: is 3000000000 bytes" in raised.value.reason


@pytest.mark.parametrize("name", ["commitment.json", "result.json", "model.safetensors", "notes.txt"])
def test_a_link_to_a_secret_is_refused_and_its_target_never_echoed(outputs, name):
    hostile.secret_link(outputs, name)
    verdict, printed = verify_dir(outputs)
    assert verdict["outcome"] == "rejected", printed
    assert f"{name}: is a symbolic link" in printed or f"{name} is a symbolic link" in printed
    assert "wJalrXUtnFEMI" not in printed and "AWS_SECRET" not in printed


# FIFOs, sockets, devices: refused by name, never opened


@pytest.mark.parametrize("name", ["result.json", "metrics.jsonl", "commitment.json", "checkpoints/model.safetensors"])
def test_a_fifo_is_refused_by_name_and_never_opened(outputs, name):
    (outputs / name).parent.mkdir(parents=True, exist_ok=True)
    hostile.fifo(outputs / name)
    reasons = rejected_for(outputs)  # the subprocess timeout fails a hang
    assert f"{name}: is a FIFO (named pipe)" in reasons or f"{name} is a FIFO (named pipe)" in reasons


def test_a_socket_file_is_refused_by_name(outputs):
    hostile.unix_socket(outputs / "result.json")
    assert "result.json is a socket; it is not opened" in rejected_for(outputs, "--trusted")


def test_every_bad_file_is_listed_not_only_the_first(outputs):
    hostile.fifo(outputs / "metrics.jsonl")
    hostile.unix_socket(outputs / "agent.sock")
    (outputs / "latest").symlink_to("/etc/passwd")
    hostile.sparse(outputs / "result.json", GB)
    hostile.tensor_file(outputs / "model.safetensors", [0, 2**100])
    reasons = rejected_for(outputs, "--trusted")
    for expected in ("metrics.jsonl is a FIFO", "agent.sock is a socket", "latest is a symbolic link",
                     "result.json is 1000000000 bytes", "model.safetensors: tensor 'w': shape [0, 1267650600228229401496703205376]"):
        assert expected in reasons


# trees and tensors: over a limit, rejected


def test_a_tree_1200_folders_deep_is_rejected_not_cannot_verify(outputs):
    hostile.deep_tree(outputs, 1200)
    try:
        reasons = rejected_for(outputs, "--trusted")
    finally:
        hostile.remove_deep_tree(outputs)
    assert "nests folders deeper than 64 levels" in reasons


def test_a_tree_at_the_depth_limit_is_accepted(outputs):
    hostile.deep_tree(outputs, output_tree.MAX_DEPTH)
    verdict, printed = verify_dir(outputs)
    assert verdict["outcome"] == "accepted", printed


@pytest.mark.parametrize("shape", [[0, 2**100], [0, 2**41], [2**20, 2**20, 0, 2**20], [0] * 33])
def test_a_tensor_with_an_unbounded_shape_is_rejected(outputs, shape):
    hostile.tensor_file(outputs / "model.safetensors", shape)
    reasons = rejected_for(outputs, "--trusted")
    assert "model.safetensors: tensor 'w': shape" in reasons and "over the limits of 32 dimensions" in reasons


def test_a_header_of_huge_names_is_rejected_with_a_short_reason(outputs):
    header = json.dumps({"n" * 100_000: {"dtype": "X" * 100_000, "shape": [1], "data_offsets": [0, 4]}}).encode()
    (outputs / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    reasons = rejected_for(outputs)
    assert "unsupported dtype 'XXX" in reasons and len(reasons) < 1000


def test_an_empty_tensor_of_a_plain_shape_is_accepted(outputs):
    hostile.tensor_file(outputs / "model.safetensors", [0, 4096])
    verdict, printed = verify_dir(outputs)
    assert verdict["outcome"] == "accepted", printed


# archives


@pytest.mark.parametrize("entries", [200, 65_535])
@pytest.mark.parametrize("trust", [[], ["--trusted"]])
def test_a_zip_bomb_of_overlapping_entries_is_rejected_whatever_the_trust(outputs, entries, trust):
    hostile.zip_bomb(outputs / "model.zip", entries=entries, member_mib=64)
    reasons = rejected_for(outputs, *trust)
    assert f"model.zip is a zip bomb: {entries - 1} of its {entries} entries overlap" in reasons


def test_zip_inspection_stops_at_its_decompression_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(zip_bounds, "MAX_INSPECTED_BYTES", 3 * 2**20)
    with zipfile.ZipFile(tmp_path / "big.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        for i in range(3):
            archive.writestr(f"part{i}.json", "{" + " " * (2 * 2**20))
    found = classify(tmp_path / "big.zip")
    assert found.kind == UNCHECKED and "past the inspection budget" in found.what


def test_many_archives_share_one_inspection_budget(outputs):
    for i in range(7):
        hostile.zip_bomb(outputs / f"part{i}.zip", entries=1, member_mib=48)  # 48 MiB of JSON-looking spaces each
    verdict, printed = verify_dir(outputs, "--trusted")
    assert verdict["outcome"] == "accepted", printed
    opaque = {item["path"]: item["what"] for item in verdict["evidence"]["safety"]["opaque"]}
    assert sorted(opaque) == ["part5.zip", "part6.zip"], printed  # 5 × 48 MiB fit in 256 MiB
    assert "past the inspection budget" in opaque["part5.zip"]
    assert "budget for looking into archives is spent" in opaque["part6.zip"]


def test_archives_are_looked_into_in_a_memory_limited_child(tmp_path):
    bomb = hostile.zip_bomb(tmp_path / "part.zip", entries=1, member_mib=48)
    assert classify_archives([bomb])[str(bomb)].kind == output_kinds.DATA
    found = classify_archives([bomb], memory_bytes=2 * 2**20)[str(bomb)]
    assert found.kind == HOSTILE and "ran out of the memory limit" in found.what


def test_a_serialized_field_past_the_first_chunk_is_still_found(tmp_path):
    with zipfile.ZipFile(tmp_path / "model.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", "{" + " " * (output_kinds.JSON_CHUNK_BYTES - 5) + '":serialized:": "gASV"}')
    assert classify(tmp_path / "model.zip").kind == output_kinds.PICKLE


def test_a_zip_declaring_too_much_is_not_inspected(tmp_path, monkeypatch):
    monkeypatch.setattr(zip_bounds, "MAX_UNCOMPRESSED_BYTES", 1000)
    with zipfile.ZipFile(tmp_path / "logs.zip", "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("log.txt", "x" * 2000)
    found = classify(tmp_path / "logs.zip")
    assert found.kind == UNCHECKED and "declare 2000 bytes uncompressed" in found.what
    assert classify(hostile.zip_bomb(tmp_path / "bomb.zip", entries=3, member_mib=1)).kind == HOSTILE


# through the broker: submit --wait


FIFO_JOB = """
import os
out = os.environ["TRAINMASTER_OUTPUT_DIR"]
open(os.path.join(out, "log.txt"), "w").write("trained\\n")
os.mkfifo(os.path.join(out, "result.json"))
os.mkfifo(os.path.join(out, "metrics.jsonl"))
print("trained", flush=True)
"""

HUGE_COMMITMENT_JOB = """
import os
out = os.environ["TRAINMASTER_OUTPUT_DIR"]
with open(os.path.join(out, "commitment.json"), "wb") as f:
    f.truncate(2 * 10**9)
print("trained", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("script", "reason"), [
    (FIFO_JOB, "metrics.jsonl is a FIFO (named pipe); it is not opened; result.json is a FIFO (named pipe)"),
    (HUGE_COMMITMENT_JOB, "commitment.json: is 2000000000 bytes, over the limit of 4096 bytes"),
])
def test_submit_wait_rejects_a_job_that_leaves_a_fifo_or_a_huge_commitment(job_factory, tmp_path, script, reason):
    spec = job_factory(script)
    env = {**os.environ, "TRAINMASTER_HOME": str(tmp_path / "home"), "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(spec), "--wait", "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    job = json.loads(done.stdout[done.stdout.index("{\n"):])
    assert job["state"] == "failed", done.stdout + done.stderr
    assert reason in json.dumps(job), done.stdout


DEEP_TREE_JOB = """
import os
out = os.environ["TRAINMASTER_OUTPUT_DIR"]
open(os.path.join(out, "log.txt"), "w").write("trained\\n")
fd = os.open(out, os.O_RDONLY)
for _ in range(1200):
    os.mkdir("x", dir_fd=fd)
    inner = os.open("x", os.O_RDONLY, dir_fd=fd)
    os.close(fd)
    fd = inner
print("trained", flush=True)
"""


@pytest.mark.slow
def test_submit_wait_rejects_a_job_that_leaves_a_tree_1200_deep(job_factory, tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "TRAINMASTER_HOME": str(home), "COLUMNS": "400"}
    try:
        done = subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", "submit", str(job_factory(DEEP_TREE_JOB)),
                               "--wait", "--json"], capture_output=True, text=True, env=env, timeout=300)
    finally:
        for ran in home.glob("jobs/*/attempts/*/outputs"):
            hostile.remove_deep_tree(ran)
    job = json.loads(done.stdout[done.stdout.index("{\n"):])
    assert job["state"] == "failed", done.stdout + done.stderr
    assert "nests folders deeper than 64 levels" in json.dumps(job), done.stdout


HOSTILE_METRICS_JOB = """
import json, os, pathlib, time
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
with open(out / "metrics.jsonl", "w") as f:
    for step in (1, 10**400, 10**400 + 1):
        f.write(json.dumps({"step": step}) + "\\n")
        f.flush()
        time.sleep(1.2)
os.replace(out / "metrics.jsonl", out / "old.jsonl")
os.mkfifo(out / "metrics.jsonl")
time.sleep(1.5)
os.unlink(out / "metrics.jsonl")
print("trained", flush=True)
"""


@pytest.mark.slow
def test_the_live_status_line_survives_a_huge_step_and_a_fifo(job_factory, tmp_path):
    from pty_follow import on_terminal

    spec = job_factory(HOSTILE_METRICS_JOB, entrypoint="python train.py --steps 3")
    code, shown = on_terminal("submit", str(spec), "--wait", home=tmp_path / "home", timeout=120)
    assert code == 0, shown
    assert "Traceback" not in shown and "OverflowError" not in shown
    assert "running · step 1/3" in shown and "accepted" in shown


# units: the bounded reader, the walk, the numbers


def test_read_regular_refuses_without_opening_or_blocking(tmp_path):
    hostile.fifo(tmp_path / "pipe")
    (tmp_path / "link").symlink_to(tmp_path / "pipe")
    hostile.sparse(tmp_path / "big", 10_001)
    (tmp_path / "folder").mkdir()
    for name, why in [("pipe", "is a FIFO"), ("link", "is a symbolic link"), ("folder", "is a directory"),
                      ("big", "is 10001 bytes, over the limit of 10000")]:
        with pytest.raises(HostileFile, match=why):
            read_regular(tmp_path / name, 10_000)
    with pytest.raises(HostileFile, match="is a character device"):
        read_regular("/dev/zero", 10)
    with pytest.raises(HostileFile, match="is a FIFO"):
        sha256_file(tmp_path / "pipe")
    with pytest.raises(HostileFile, match="is a FIFO"):
        read_tail(tmp_path / "pipe", 10)
    (tmp_path / "ok").write_bytes(b"x" * 10_000)
    assert read_regular(tmp_path / "ok", 10_000) == b"x" * 10_000
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing", 10)


def _tail_step(path):
    """The step the status line takes from `path`, as the local backend reports its metrics."""
    from trainmaster.backends.features import MetricsChunk

    return last_step(MetricsChunk.from_file(path, 0, 4096))


def test_last_step_of_a_fifo_is_unknown_without_blocking(tmp_path):
    hostile.fifo(tmp_path / "metrics.jsonl")
    found = []
    reader = threading.Thread(target=lambda: found.append(_tail_step(tmp_path / "metrics.jsonl")), daemon=True)
    reader.start()
    reader.join(10)
    assert found == [None]


def test_a_step_past_2_53_is_not_a_step(tmp_path):
    hostile.huge_step_metrics(tmp_path / "metrics.jsonl")
    assert _tail_step(tmp_path / "metrics.jsonl").step == 10
    (tmp_path / "ok.jsonl").write_text(json.dumps({"step": 2**53}) + "\n")
    assert _tail_step(tmp_path / "ok.jsonl").step == 2**53


@pytest.mark.parametrize(("seconds", "shown"), [(float("inf"), "—"), (float("nan"), "—"), (-1.0, "—"),
                                                 (1e300, ">9999:59:59"), (3725.0, "1:02:05")])
def test_a_duration_is_drawn_whatever_the_number(seconds, shown):
    assert duration(seconds) == shown


def test_the_walk_stops_past_its_entry_limit_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(output_tree, "MAX_ENTRIES", 5)
    for i in range(8):
        (tmp_path / f"f{i}").write_text("x")
    tree = output_tree.walk(tmp_path)
    assert len(tree.files) == 5 and tree.refused == ["the outputs hold more than 5 files and folders; the rest is not looked at"]


def test_a_long_path_is_refused(tmp_path):
    folder = tmp_path
    for _ in range(5):
        folder = folder / ("d" * 250)
    folder.mkdir(parents=True)
    (folder / "f").write_text("x")
    tree = output_tree.walk(tmp_path)
    assert tree.files == [] and "is a path longer than 1024 bytes" in tree.refused[0]

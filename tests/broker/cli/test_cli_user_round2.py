"""#33, what a user meets, through the real CLI (in an 80-column pseudo-terminal where it is about display):

§3 a torchrun job whose rank fails says which rank and its last error line, never torchrun's banner; the cost-cap
stop says so in the log; a CPU job's estimate is in hours, not A100-hours; `offers` shows a short run's time.
§4 a job id and a folder of that name: the job wins, `./NAME` marks the folder, a bare prefix asks which.
§5 stale price catalogs are one clean warning line per command; `ls` lists the jobs that just ended.
§6 offers (clouds), executors ls, models ls, ls and status read at 80 columns; `--wide` shows every column.
§7 `executors ban` checks the key as backends.yaml does; a model registry that is down costs one try and says so.
"""

from __future__ import annotations

import json
import time

import pytest

from cli_run import tm
from pty_run import in_terminal

OUTPUT = ("import os, pathlib\n"
          "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n")
CLOUDS = "name: c\ndefault:\n  primary: aws\n  fallbacks: [gcp, azure]\n"
DDP = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} up", flush=True)
if rank == 1:
    print("terminate called without an active exception", file=sys.stderr, flush=True)
    os.abort()
time.sleep(30)
"""
VALID_HOTKEY = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
READY_CLOUDS = ("aws:\n  region: us-east-1\n  s3_bucket: b\n  sagemaker_role_arn: arn:aws:iam::123456789012:role/r\n"
                "gcp:\n  project: p\n  staging_bucket: gs://b\n"
                "azure:\n  subscription_id: s\n  resource_group: rg\n  workspace: ws\n  storage_account: a\n"
                "  datastore: d\n")


@pytest.fixture
def clouds_set_up(tm_home, tmp_path, monkeypatch):
    """All three clouds ready as `backends check` sees them (a bucket, a role, a workspace, credentials in the
    environment), so their offers are planned — nothing here reaches a cloud."""
    (tm_home / "config").mkdir(parents=True, mode=0o700)  # as the CLI makes a home: private
    tm_home.chmod(0o700)
    (tm_home / "config" / "backends.yaml").write_text(READY_CLOUDS)
    (tmp_path / "gcp-key.json").write_text("{}")
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_EC2_METADATA_DISABLED": "true", "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "gcp-key.json"),
                        "AZURE_CLIENT_ID": "id", "AZURE_TENANT_ID": "tenant"}.items():
        monkeypatch.setenv(name, value)


def _fits(shown, width: int = 80, but=("job dir:", "outputs:")) -> None:
    from rich.cells import cell_len

    wide = [line for line in shown.lines if cell_len(line) > width and not any(b in line for b in but)]
    assert not wide, "\n".join(wide) + "\n---\n" + shown.text


def _alone_words(shown) -> list[str]:
    """Runs of lines holding a single word each (what a reason squeezed into a narrow column looks like; the last
    word of a wrapped sentence alone on its line is not one)."""
    single = [bool(line.strip()) and " " not in line.strip() for line in shown.lines]
    return [line.strip() for i, line in enumerate(shown.lines)
            if single[i] and ((i and single[i - 1]) or (i + 1 < len(single) and single[i + 1]))]


# §3

def test_a_ddp_failure_names_the_failing_rank_and_its_last_error_line(tm_home, job_factory):
    spec = job_factory(DDP, "estimated_hours: 0.001\nresources:\n  processes: 2\n")
    out = tm("submit", str(spec), "--wait", "--json", home=tm_home, timeout=300)
    job = json.loads(out.stdout)
    assert job["state"] == "failed", job
    reason = job["attempts"][0]["reason"]
    assert reason.startswith("rank 1 (local rank 1) exited with code -6 (SIGABRT): terminate called without an "
                             "active exception"), reason
    assert "=====" not in reason and "=====" not in job["reason"]
    listed = tm("ls", "--all", home=tm_home).stdout
    assert job["id"] in listed
    screen = in_terminal("status", job["id"], home=tm_home)
    assert "rank 1 (local rank 1) exited with code -6" in screen.text, screen.text
    _fits(screen)


def test_the_cost_cap_stop_says_cost_cap_in_the_log(tm_home, job_factory):
    spec = job_factory("import time\ntime.sleep(600)\n",
                       "estimated_hours: 0.001\nlimits:\n  max_usd: 0.00008\noutputs:\n  optional: true\n")
    job = json.loads(tm("submit", str(spec), "--json", home=tm_home).stdout)  # no broker watching: the run's own
    exit_json = tm_home / "jobs" / job["id"] / "attempts" / "1" / "exit.json"  # limit stops it at the cap
    deadline = time.time() + 120
    while not exit_json.exists() and time.time() < deadline:
        time.sleep(0.5)
    while True:  # the run has stopped; the background pass a read starts records it (a read never does)
        shown = json.loads(tm("status", job["id"], "--json", home=tm_home).stdout)
        if shown["state"] != "running" or time.time() > deadline:
            break
        time.sleep(0.5)
    assert shown["state"] == "failed" and "cost cap" in shown["reason"], shown
    log = tm("logs", job["id"], home=tm_home).stdout
    said = [line for line in log.splitlines() if line.startswith("[trainmaster] cost cap reached: ")]
    assert said and "limits.max_usd" in said[0], log  # whichever stopped it first: its own limit or
    # the broker's watch (a background pass the submit started)
    assert "time limit reached" not in log


def test_a_cpu_jobs_estimate_is_in_hours_and_offers_show_a_short_runs_time(tm_home, job_factory):
    spec = job_factory(OUTPUT, "estimated_hours: 0.001\n")
    dry = json.loads(tm("submit", str(spec), "--dry-run", "--json", home=tm_home).stdout)
    assert dry["estimate"] == "estimated_hours 0.001 (hours)"
    screen = in_terminal("offers", str(spec), home=tm_home)
    assert "A100" not in screen.text and "0.0 " not in screen.text, screen.text
    [row] = [line for line in screen.lines if " local " in line]
    assert " 4 s " in row, row  # 0.001 h
    _fits(screen)


# §4

def test_a_job_id_wins_over_the_folder_of_its_name_and_dot_slash_marks_the_folder(tm_home, job_factory, tmp_path):
    job = json.loads(tm("submit", str(job_factory(OUTPUT)), "--wait", "--json", home=tm_home).stdout)
    assert job["state"] == "accepted"
    work = tmp_path / "work"
    work.mkdir()
    assert tm("outputs", job["id"], home=tm_home, cwd=work).returncode == 0
    assert (work / job["id"] / "out.txt").is_file()  # the folder of the job's name
    shown = tm("verify", "show", job["id"], "--json", home=tm_home, cwd=work)
    assert shown.returncode == 0 and json.loads(shown.stdout)["job_id"] == job["id"], shown.stdout + shown.stderr
    assert f"write ./{job['id']} for the folder" in shown.stderr
    folder = tm("verify", "show", f"./{job['id']}", "--json", "--trusted", home=tm_home, cwd=work)
    assert json.loads(folder.stdout)["job_id"] is None, folder.stdout  # the folder, judged as a folder
    prefix = job["id"][:3]
    (work / prefix).mkdir()
    asked = tm("verify", "show", prefix, home=tm_home, cwd=work)
    assert asked.returncode == 2 and f"write ./{prefix} to check the folder" in asked.stderr, asked.stderr


# §5

def test_stale_price_catalogs_are_one_clean_warning_line_per_command(tm_home, job_factory, tmp_path, clouds_set_up):
    (tmp_path / "clouds.yaml").write_text(CLOUDS)
    spec = job_factory(OUTPUT, "estimated_hours: 1\nresources:\n  gpus: 1\n")
    for args in (["submit", str(spec), "--dry-run", "--policy", str(tmp_path / "clouds.yaml")],
                 ["offers", str(spec), "--policy", str(tmp_path / "clouds.yaml")]):
        out = tm(*args, home=tm_home)
        said = [line for line in out.stderr.splitlines() if "catalog" in line]
        assert len(said) == 1 and said[0].startswith("warning: price catalogs older than 90 days"), out.stderr
        assert "StaleCatalogWarning" not in out.stderr and "warnings.warn" not in out.stderr and ".py:" not in out.stderr
        assert all(name in said[0] for name in ("aws.csv", "gcp.csv", "azure.csv"))


def test_a_run_a_little_longer_than_its_estimate_is_no_news(tm_home, job_factory):
    """Its charge is above the reservation (the estimate: 0.36 s; the run: seconds), by a fraction of a cent."""
    spec = job_factory("import time\ntime.sleep(1)\n" + OUTPUT, "estimated_hours: 0.0001\n")
    for _ in range(2):
        out = tm("submit", str(spec), "--wait", "--json", home=tm_home)
        job = json.loads(out.stdout)
        assert job["state"] == "accepted" and job["cost_micro_usd"] > 0
        assert "above its reservation" not in out.stderr, out.stderr


def test_ls_lists_the_jobs_that_just_ended(tm_home, job_factory):
    job = json.loads(tm("submit", str(job_factory(OUTPUT)), "--wait", "--json", home=tm_home).stdout)
    listed = tm("ls", home=tm_home)
    assert job["id"] in listed.stdout and "accepted" in listed.stdout, listed.stdout
    assert [j["id"] for j in json.loads(tm("ls", "--json", home=tm_home).stdout)] == [job["id"]]


# §6

def test_cloud_offers_read_at_80_columns_with_regions_and_reasons_below_rows(tm_home, job_factory, tmp_path,
                                                                            clouds_set_up):
    (tmp_path / "clouds.yaml").write_text(CLOUDS)
    spec = job_factory(OUTPUT, "estimated_hours: 2\nresources:\n  gpus: 1\n")
    screen = in_terminal("offers", str(spec), "--policy", str(tmp_path / "clouds.yaml"), home=tm_home)
    _fits(screen)
    header = next(line for line in screen.lines if "backend" in line and "instance" in line)
    assert all(h in header for h in ("region", "GPUs", "$/hour", "time", "expected")), header
    rows = [line for line in screen.lines if " aws " in line]
    assert len(rows) == len(set(rows)), "\n".join(rows)  # no two rows look alike: the region tells them apart
    assert "    costlier than the chosen offer" in screen.lines, screen.text  # whole, below its row
    assert not _alone_words(screen), _alone_words(screen)
    wide = in_terminal("offers", str(spec), "--policy", str(tmp_path / "clouds.yaml"), "--wide", home=tm_home)
    assert "of which" in wide.text and "left out" not in wide.text


def test_executors_models_ls_and_status_read_at_80_columns(tm_home, job_factory):
    reason = ("caught serving outputs whose bytes differ from the sha256 it announced in three separate jobs "
              "over two days, each time on the largest file")
    assert tm("executors", "ban", VALID_HOTKEY, "--reason", reason, home=tm_home).returncode == 0
    screen = in_terminal("executors", "ls", home=tm_home)
    _fits(screen)
    assert VALID_HOTKEY in screen.text  # whole: it fits
    assert not _alone_words(screen), screen.text
    folded = " ".join(line.strip() for line in screen.lines if line.startswith("    "))
    assert reason in folded, screen.text

    job = json.loads(tm("submit", str(job_factory(OUTPUT, name="a-rather-long-model-name-for-a-job")), "--wait",
                        "--json", home=tm_home).stdout)
    for args in (["models", "ls"], ["ls"], ["ls", "--all"], ["status", job["id"]]):
        screen = in_terminal(*args, home=tm_home)
        assert screen.code == 0, screen.text
        _fits(screen)
        assert job["id"] in screen.text, (args, screen.text)  # the id whole
        assert not _alone_words(screen), (args, screen.text)


# §7

def test_executors_ban_checks_the_key_as_backends_yaml_does(tm_home):
    typo = tm("executors", "ban", "5NotAValidKey", home=tm_home)
    assert typo.returncode == 2 and "is not an ss58 hotkey" in typo.stderr, typo.stderr
    checksum = tm("executors", "ban", VALID_HOTKEY[:-1] + "Z", home=tm_home)
    assert checksum.returncode == 2 and "check it for a typo" in checksum.stderr, checksum.stderr
    assert json.loads(tm("executors", "ls", "--json", home=tm_home).stdout)["bans"] == []
    assert tm("executors", "ban", VALID_HOTKEY, home=tm_home).returncode == 0


def test_a_model_registry_that_is_down_costs_one_try_and_says_what_is_down(tm_home, job_factory):
    from miner_support import free_port

    (tm_home / "config").mkdir(parents=True, exist_ok=True)
    (tm_home / "config" / "registry.yaml").write_text(
        f"mlflow:\n  tracking_uri: http://127.0.0.1:{free_port()}\n  timeout_s: 5\n  retries: 0\n")
    out = tm("submit", str(job_factory(OUTPUT)), "--wait", "--json", home=tm_home)
    job = json.loads(out.stdout)
    assert job["state"] == "accepted"
    assert "warning: the model registry is down (MLflow at http://127.0.0.1:" in out.stderr, out.stderr
    assert f"the promotion of {job['id']} waits" in out.stderr
    listed = json.loads(tm("models", "ls", "--json", home=tm_home).stdout)
    tried = listed[0]["error"]
    began = time.monotonic()
    later = tm("ls", home=tm_home)
    assert later.returncode == 0 and "registry" not in later.stderr, later.stderr  # not asked again so soon
    assert time.monotonic() - began < 10
    assert json.loads(tm("models", "ls", "--json", home=tm_home).stdout)[0]["error"] == tried

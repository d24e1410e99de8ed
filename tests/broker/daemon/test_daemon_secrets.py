"""Secrets stay with the daemon: a job that prints its environment (and its parent's) under a daemon whose own
environment holds the database's password, cloud keys, tokens and a wallet password sees none of them, only the
documented allowlist, the job's variables and its spec's `env:`; its outputs in the shared storage are readable by
their owner and the shared folder's group only."""

from __future__ import annotations

import json
import os
import stat

from cli_run import tm
from daemon_support import daemon_start, kill

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value-1", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEVALUE2",
    "HF_TOKEN": "hf-token-value-3", "BT_WALLET_PASSWORD": "wallet-password-4", "GITHUB_TOKEN": "gh-token-value-5",
    "AZURE_CLIENT_SECRET": "azure-secret-value-6", "OPENAI_API_KEY": "openai-key-value-7",
    "TRAINMASTER_WALLET_PASSWORD": "tm-wallet-value-8", "SOME_UNLISTED_SETTING": "unlisted-value-9",
}
JOB = """\
import json, os, pathlib
out = pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'])
parent = pathlib.Path(f'/proc/{os.getppid()}/environ').read_bytes().decode(errors='replace')
out.joinpath('env.json').write_text(json.dumps({'env': dict(os.environ), 'parent': parent}))
print('ENV', json.dumps(dict(os.environ)))
"""


def test_a_job_printing_its_environment_sees_no_secret_and_its_outputs_are_not_world_readable(
        tm_home, tmp_path, job_factory, postgres_server):
    url = postgres_server.database().replace("postgresql://tm@", "postgresql://tm:db-password-0@")  # trust: unused
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)  # a root others may enter: what is written there must still not be theirs to read
    env = {"TRAINMASTER_DATABASE_URL": url, "TRAINMASTER_SHARED_STORAGE": str(shared), "OMP_NUM_THREADS": "1",
           **SECRETS}
    out = daemon_start(tm_home, extra_env=env)
    assert out.returncode == 0, out.stderr
    pid = json.loads((tm_home / "daemon" / "state.json").read_text())["pid"]
    try:
        spec = job_factory(JOB, "env:\n  MINE: from-the-spec\n")
        done = tm("submit", str(spec), "--wait", "--json", home=tm_home, extra_env=env, timeout=180)
        assert done.returncode == 0, done.stderr
        job = json.loads(done.stdout)
        assert job["state"] == "accepted", job
        log = tm("logs", job["id"], home=tm_home, extra_env=env).stdout
        [seen] = [json.loads(line[4:]) for line in log.splitlines() if line.startswith("ENV ")]
        shown = json.dumps(seen) + log
        for value in [*SECRETS.values(), "db-password-0", url]:
            assert value not in shown, value
        assert not any(name.startswith("TRAINMASTER_") and name not in JOB_VARIABLES for name in seen), sorted(seen)
        assert "TRAINMASTER_DATABASE_URL" not in seen and "SOME_UNLISTED_SETTING" not in seen
        assert seen["MINE"] == "from-the-spec" and seen["OMP_NUM_THREADS"] == "1" and seen["PATH"]
        assert seen["TRAINMASTER_JOB_ID"] == job["id"]
        outputs = shared / "jobs" / job["id"]
        kept = json.loads((outputs / "outputs" / "env.json").read_text())
        for value in [*SECRETS.values(), "db-password-0"]:
            assert value not in kept["parent"], "the job's parent (its supervisor) held a secret"
        files = [p for p in outputs.rglob("*")]
        assert files
        for path in files:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o007 == 0, f"{path} is {oct(mode)}: readable by others"
            assert path.stat().st_gid == shared.stat().st_gid
            assert mode & 0o070 == (0o050 if path.is_dir() else 0o040), f"{path} is {oct(mode)}"
    finally:
        kill(pid)


JOB_VARIABLES = {"TRAINMASTER_JOB_ID", "TRAINMASTER_OUTPUT_DIR", "TRAINMASTER_CHECKPOINT_DIR", "TRAINMASTER_RESUME_FROM",
                 "TRAINMASTER_SEED", "TRAINMASTER_SEGMENT_STEPS", "TRAINMASTER_BUNDLE_SHA256",
                 "TRAINMASTER_KEEP_EVERY", "TRAINMASTER_MAX_DISK_GB",  # #35: which states the runtime keeps
                 "TRAINMASTER_SELFCHECK"}  # whether the run ends with its self-check (checkpoint.selfcheck)


def test_the_allowlist_keeps_what_a_job_needs_and_drops_what_looks_secret():
    from trainmaster.jobs.inherited import inherited

    environ = {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C", "CUDA_HOME": "/cuda",
               "NCCL_DEBUG": "INFO", "PIP_INDEX_URL": "https://pypi", "PIP_PASSWORD": "x", "HF_HOME": "/hf",
               "HF_TOKEN": "x", "TRAINMASTER_HOME": "/tm", "TRAINMASTER_DATABASE_URL": "postgresql://a:b@c/d",
               "AWS_PROFILE": "p", "MY_VAR": "v", "MY_API_KEY": "k", "WANDB_API_KEY": "k"}
    assert inherited(environ) == {"PATH": "/bin", "HOME": "/h", "LANG": "C.UTF-8", "LC_ALL": "C",
                                  "CUDA_HOME": "/cuda", "NCCL_DEBUG": "INFO", "PIP_INDEX_URL": "https://pypi",
                                  "HF_HOME": "/hf"}
    assert inherited(environ, ["MY_*", "TRAINMASTER_DATABASE_URL", "WANDB_API_KEY"]) == {
        **inherited(environ), "MY_VAR": "v"}  # a configured name that looks secret is still never inherited
    assert os.environ.get("PATH")  # the test's own environment is untouched


def test_the_daemon_makes_itself_non_dumpable_so_its_environment_is_not_readable_by_jobs():
    import subprocess
    import sys

    probe = ("import ctypes; from trainmaster.broker.daemon.private import not_dumpable, PR_GET_DUMPABLE\n"
             "before = ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)\n"
             "print(before, not_dumpable(), ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "True", "0"]
    child = subprocess.run([sys.executable, "-c", "import ctypes; from trainmaster.broker.daemon.private import "
                            "not_dumpable, PR_GET_DUMPABLE; not_dumpable(); import subprocess, sys; print(subprocess."
                            "run([sys.executable, '-c', 'import ctypes; print(ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))']"
                            ", capture_output=True, text=True).stdout.strip())"], capture_output=True, text=True)
    assert child.stdout.strip() == "1"  # what it starts (a job's keeper, an audit worker) is dumpable again


# a model file by hand (safetensors: 8-byte header length, JSON header, data), so the job needs no torch
MAKE_MODEL = """\
import json, os, pathlib, struct
header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"], "model.safetensors").write_bytes(
    struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.0))
"""
EVALUATOR = """\
import json, os, pathlib
pathlib.Path(os.environ['SEEN_AT']).write_text(json.dumps(dict(os.environ)))
print(json.dumps({'score': 1.0}))
"""


def test_the_evaluator_is_the_jobs_code_and_sees_no_secret_of_the_broker(tm_home, tmp_path, job_factory):
    """The broker runs the job's evaluator (and replays its recipe) in the audit pool, whose environment is the
    broker's: the evaluator gets what a job inherits, never the broker's secrets."""
    seen = tmp_path / "evaluator-env.json"
    spec = job_factory(MAKE_MODEL,
                       f"env:\n  SEEN_AT: {seen}\nverification:\n  evaluator: python evaluate.py\n"
                       "  thresholds:\n    score: 0.5\n")
    (spec.parent / "evaluate.py").write_text(EVALUATOR)
    done = tm("submit", str(spec), "--wait", "--json", home=tm_home, extra_env=SECRETS, timeout=300)
    assert json.loads(done.stdout)["state"] == "accepted", done.stdout + done.stderr
    env = json.loads(seen.read_text())
    leaked = {name for name, value in SECRETS.items() if name in env or value in json.dumps(env)}
    assert leaked == set(), leaked
    assert not any(name.startswith("TRAINMASTER_") and name != "TRAINMASTER_EVAL_CHECKPOINT" for name in env), env
    assert env["SEEN_AT"] == str(seen) and "PATH" in env

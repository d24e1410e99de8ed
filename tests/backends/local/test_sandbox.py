"""A confined job (LocalConfig.sandbox) cannot see the miner's wallet or home, nor other jobs, runs as its
own unprivileged user under its limits, writes nowhere but its work dir; without the sandbox it could."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sandbox_support import backend, fetch, log, run, submit, wait, workdir
from trainmaster.backends.local.config import Sandbox

WALLET_BYTES = b"0xSEED-do-not-leak-5f3a9c"

PROBE = """
    import json, os, pathlib, resource
    out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
    seen = {{"uid": os.getuid(), "gid": os.getgid(), "home": os.environ.get("HOME"),
             "env": sorted(os.environ)}}
    def attempt(name, fn):
        try:
            seen[name] = fn()
        except OSError as exc:
            seen[name] = f"denied: {{type(exc).__name__}}"
    attempt("wallet", lambda: pathlib.Path({wallet!r}).read_bytes().hex())
    attempt("miner_home", lambda: sorted(os.listdir({home!r})))
    attempt("other_job", lambda: sorted(os.listdir({other!r})))
    attempt("write_outside", lambda: pathlib.Path({outside!r}).write_text("x") and "written")
    attempt("write_tmp", lambda: pathlib.Path("/tmp/sandbox-probe-{tag}").write_text("x") and "written")
    attempt("root_home", lambda: sorted(os.listdir("/root")))
    seen["limits"] = {{name: resource.getrlimit(getattr(resource, name))[0]
                       for name in ("RLIMIT_AS", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE")}}
    (out / "seen.json").write_text(json.dumps(seen))
"""


@pytest.fixture
def miner(tmp_path) -> dict[str, Path]:
    """A miner's home holding a 0600 wallet file in a hidden folder, and a folder the job must not write."""
    home = tmp_path / "miner-home"
    wallet = home / ".bittensor" / "wallets" / "default" / "coldkey"
    wallet.parent.mkdir(parents=True)
    wallet.write_bytes(WALLET_BYTES)
    wallet.chmod(0o600)
    (tmp_path / "elsewhere").mkdir()
    return {"home": home, "wallet": wallet, "outside": tmp_path / "elsewhere" / "dropped.txt"}


def probe(miner: dict[str, Path], other: Path, tag: str) -> str:
    return PROBE.format(wallet=str(miner["wallet"]), home=str(miner["home"]), other=str(other),
                        outside=str(miner["outside"]), tag=tag)


def sandbox_for(miner: dict[str, Path], **kw) -> Sandbox:
    return Sandbox(hide=[str(miner["home"]), str(miner["wallet"].parent.parent)], memory_mb=8192, open_files=256,
                   processes=300, file_size_gb=2, **kw)


def test_a_confined_job_cannot_read_the_wallet_or_anything_but_its_own_folder(tmp_path, miner):
    local = backend(sandbox_for(miner))
    first = submit(local, tmp_path, "import pathlib, os\n"
                   "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'secret.txt').write_text('job one')\n")
    assert wait(local, first).phase.value == "succeeded", log(first)
    st, seen, handle = run(local, tmp_path, probe(miner, workdir(first) / "outputs", "a"))

    assert st.phase.value == "succeeded", log(handle)
    assert seen["wallet"].startswith("denied") or seen["wallet"] == "", seen
    assert seen["miner_home"] == [] or seen["miner_home"].startswith("denied"), seen
    assert seen["other_job"] == [] or str(seen["other_job"]).startswith("denied"), seen
    on_the_way = {Path(p).relative_to("/root").parts[0] for p in (sys.base_prefix, sys.prefix) if p.startswith("/root/")}
    assert str(seen["root_home"]).startswith("denied") or set(seen["root_home"]) <= on_the_way, seen
    assert seen["write_outside"].startswith("denied"), seen
    assert not miner["outside"].exists() and not Path("/tmp/sandbox-probe-a").exists()
    assert seen["uid"] >= 2_000_000 and seen["gid"] == seen["uid"]
    assert seen["home"] == str(workdir(handle) / "scratch")
    assert not any(k.startswith("PYTEST") for k in seen["env"]), seen["env"]
    assert seen["limits"] == {"RLIMIT_AS": 8192 * 2**20, "RLIMIT_NOFILE": 256, "RLIMIT_NPROC": 300,
                              "RLIMIT_FSIZE": 2 * 2**30, "RLIMIT_CORE": 0}
    everything = b"".join(fetch(local, handle, tmp_path / "again").values()) + log(handle).encode()
    assert WALLET_BYTES not in everything and WALLET_BYTES.hex().encode() not in everything
    assert os.stat(workdir(handle) / "outputs" / "seen.json").st_uid == 0  # taken back once it ended


def test_two_confined_jobs_run_as_different_users(tmp_path, miner):
    local = backend(sandbox_for(miner))
    script = "import os, pathlib, time\n" \
             "pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'seen.json').write_text('{\"uid\": %d}' % os.getuid())\n" \
             "time.sleep(1)\n"
    handles = [submit(local, tmp_path, script) for _ in range(2)]
    uids = []
    for h in handles:
        assert wait(local, h).phase.value == "succeeded", log(h)
        uids.append(int(fetch(local, h, tmp_path / f"f-{h.attempt_id}")["seen.json"].split(b":")[1].strip(b" }")))
    assert len(set(uids)) == 2 and min(uids) >= 2_000_000


def test_the_same_job_without_the_sandbox_reads_the_wallet(tmp_path, miner):
    st, seen, handle = run(backend(None), tmp_path, probe(miner, tmp_path, "b"))
    assert st.phase.value == "succeeded", log(handle)
    assert bytes.fromhex(seen["wallet"]) == WALLET_BYTES
    assert seen["uid"] == os.getuid() and seen["write_outside"] == "written"



def test_a_confined_job_with_requirements_is_refused_not_built_as_root(tmp_path, miner):
    local = backend(sandbox_for(miner))
    handle = submit(local, tmp_path, "print('never')\n", "environment:\n  python: requirements\n",
                    files={"requirements.txt": "six\n"})
    st = wait(local, handle)
    assert st.phase.value == "failed" and "environment: requirements" in st.reason, st.reason
    assert not (tmp_path / "attempts" / "envs").exists() and "python:" not in log(handle)

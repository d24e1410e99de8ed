"""An executor whose torch picks another CPU kernel set than the verifier's, through the user's path: `trainmaster
submit JOB --wait` under the default ("sampled") tier, a reference miner (a process of its own) whose jobs compute
with torch's portable kernels (ATEN_CPU_CAPABILITY=default, passed on by its local backend's `inherit_env`), the
broker's verifier with this machine's own vector kernels.

The portable kernels draw other initial bits (W0) from the same recipe and seed, so S_0 cannot be compared with the
verifier's own; the verifier rebuilds S_0 with the kernel set the signed commitment names (a child process) and
compares it bit for bit (docs/audit.md, "Kernel sets"). The honest miner is accepted and paid; a miner that starts
from a W0 of its own choosing, whichever kernel set it names, is still rejected at S_0 and banned.

The job is the short tiny LM (tests/tiny_lm_job.py `short_job`): what is proved is about S_0, not the training's
length.
"""

from __future__ import annotations

import json

import pytest

from cheater_support import (  # noqa: F401 — fixtures: the tests' environment and started miners
    BANNED, CHEAP_PRICES, HONEST_PRICES, _caught, _coldkey, _setup, started, wallets,
)
from cheating_miners.process import CheaterProcess
from miner_support import MinerProcess, make_wallet
from miner_support import shown as _shown, tm as _tm
from state_rows import state_rows
from tiny_lm_job import short_job

pytestmark = pytest.mark.slow

PORTABLE = {"local": {"inherit_env": ["ATEN_CPU_CAPABILITY"]}, "confine": False}
"""A miner whose jobs inherit its ATEN_CPU_CAPABILITY (a confined job's environment is scrubbed of everything)."""


def _submit(spec, policy) -> dict:
    done = _shown(_tm("submit", str(spec), "--policy", str(policy), "--wait", "--json"))
    return _shown(_tm("status", done["id"], "--json"))


def test_an_honest_miner_on_the_portable_kernels_is_accepted_and_paid(tmp_path, tm_home, wallets, started,
                                                                      monkeypatch):
    """Today's false reject, fixed: the commitment names `cpu DEFAULT`, the verifier rebuilds that S_0 in a child."""
    import torch

    assert torch.backends.cpu.get_cpu_capability() != "DEFAULT"  # the verifier's kernels are not the miner's
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    miner = started(MinerProcess(tmp_path / "portable", make_wallet(wallets, "portable"),
                                 config={**HONEST_PRICES, **PORTABLE}))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    spec, policy = _setup(tmp_path, tm_home, [miner], job_yaml=short_job())
    shown = _submit(spec, policy)
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    assert attempt["state"] == "accepted", shown
    payments = state_rows(tm_home, "SELECT payee, attempt_id FROM payments WHERE job_id = ?", shown["id"])
    assert [tuple(p) for p in payments] == [(_coldkey(miner), attempt["id"])]
    verdict = _shown(_tm("verify", "show", shown["id"], "--json"))
    replay = verdict["evidence"]["replay"]
    assert replay["tier"] == "sampled" and replay["passed"], replay
    initial = replay["initial_state"]
    assert initial["kernels"] == "DEFAULT" and initial["rebuilt"] == "child" and initial["matched"], initial
    assert "cpu DEFAULT" in _commitment(miner, attempt["id"])["deterministic"]
    text = _tm("verify", "show", shown["id"]).stdout
    assert "S_0 rebuilt with the executor's CPU kernels (DEFAULT; this verifier: " in text and "): equal" in text, text
    assert not _shown(_tm("executors", "ls", "--json"))["bans"]


def test_a_miner_on_the_portable_kernels_with_a_w0_of_its_own_is_rejected_unpaid_and_banned(
        tmp_path, tm_home, wallets, started, monkeypatch):
    """The `w0` cheat (tests/cheating_miners: another seed's model as W0, honest training from it) on the portable
    kernels: its commitment names `cpu DEFAULT`, the verifier's child rebuilds that kernel set's S_0, and the cheat's
    is not it."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    cheater = started(CheaterProcess("w0", tmp_path / "w0", make_wallet(wallets, "w0"), config={**CHEAP_PRICES, **PORTABLE}))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    spec, policy = _setup(tmp_path, tm_home, [cheater], job_yaml=short_job())
    shown = _submit(spec, policy)
    attempt = _caught(tm_home, shown, cheater, spec, policy)
    assert ("the replay audit failed: segment 0: S_0's weights are not the W0 the spec's recipe and seed produce with "
            "the CPU kernel set DEFAULT") in attempt["reason"], shown
    assert shown["state"] == "failed" and BANNED in shown["reason"], shown
    assert not state_rows(tm_home, "SELECT * FROM payments")
    verdict = _shown(_tm("verify", "show", shown["id"], "--json"))
    initial = verdict["evidence"]["replay"]["initial_state"]
    assert (initial["kernels"], initial["rebuilt"], initial["matched"]) == ("DEFAULT", "child", False), initial
    assert "cpu DEFAULT" in _commitment(cheater, attempt["id"])["deterministic"]


def _commitment(miner: MinerProcess, attempt_id: str) -> dict:
    [found] = (miner.home / "jobs").glob(f"*/outputs/commitment.json")
    return json.loads(found.read_text())

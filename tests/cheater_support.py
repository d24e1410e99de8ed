"""The broker's side of the cheating-miner tests (tests/cheating_miners): the miners started as real processes (a
cheater cheaper than the honest one), the broker's home listing them with its policy, and what a caught cheater
leaves (its attempt rejected with a reason, unpaid, banned by hotkey and coldkey, left out of the next offers)."""

from __future__ import annotations

import os

import pytest

from cheating_miners.process import TESTS, CheaterProcess
from miner_support import MinerProcess, make_wallet
from miner_support import shown as _shown, tm as _tm
from state_rows import state_rows
from tiny_lm_job import EVALUATOR, JOB, TINY_LM

HONEST_PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}
CHEAP_PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 1_000_000_000}}, "default_hours": 0.25}
BANNED = "its executor is banned (trainmaster executors ls)"
IDLE_JOB = JOB.format(entrypoint="python -c 'import time; time.sleep(30)'")
"""A job that trains and commits nothing (a user's job may be any command): for a miner whose cheat is that it never
says how its run went, or says it runs forever, the broker never gets as far as what the run made."""
MADE_JOB = JOB.format(entrypoint="python -c \"import os; open(os.path.join(os.environ['TRAINMASTER_OUTPUT_DIR'], "
                                 "'model.safetensors'), 'wb').write(os.urandom(4096))\"")
"""A job that trains nothing and ends with one output (4 kB under the name of a model): for a miner whose cheat is in
how it announces or serves its outputs, refused during their download, before anything verifies what they are (a
run of the tiny LM, its training and its self-check, would cost ~10 s of CPU and prove nothing more there)."""
POLICY = ("name: tao\ndefault:\n  primary: bittensor\n  unreachable_after_s: {unreachable}\n"
          "tao_rate:\n  usd_per_tao: 400\n"
          "verification:\n  tau: 0.01\n  challenge_deadline_s: {deadline}\n")


@pytest.fixture
def wallets(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    return tmp_path / "wallets"


@pytest.fixture
def started():
    procs: list[MinerProcess] = []
    yield lambda proc: procs.append(proc.start()) or proc
    for proc in procs:
        proc.stop()


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> MinerProcess:
    """One honest miner for all of a file's tests (a process started once, ~10 s on a loaded machine): it keeps
    each job under its attempt's id and bans nobody, and every test has its own broker (home, wallet, state), so
    the tests that list it never see each other's work through it."""
    root = tmp_path_factory.mktemp("honest")
    miner = MinerProcess(root / "miner", make_wallet(root / "wallets", "honest"), config=HONEST_PRICES).start()
    yield miner
    miner.stop()


def _cheater(kind: str, tmp_path, wallets, started) -> CheaterProcess:
    return started(CheaterProcess(kind, tmp_path / kind, make_wallet(wallets, kind), config=CHEAP_PRICES))


def _honest(tmp_path, wallets, started) -> MinerProcess:
    return started(MinerProcess(tmp_path / "honest", make_wallet(wallets, "honest"), config=HONEST_PRICES))


def _setup(tmp_path, tm_home, listed: list[MinerProcess], deadline_s: float = 600, unreachable_s: float = 600,
           job_yaml: str | None = None):
    """The job (the tiny LM, 100 steps in 4 segments unless `job_yaml` says otherwise: tests/tiny_lm_job.py
    `short_job`), the policy and backends.yaml listing `listed`; the spec's and the policy's paths."""
    make_wallet(tmp_path / "wallets", "broker")
    job = tmp_path / "job"
    job.mkdir(exist_ok=True)
    (job / "job.yaml").write_text(job_yaml or JOB.format(entrypoint=TINY_LM.format(steps=100)))
    (job / "evaluate.py").write_text(EVALUATOR)
    (tmp_path / "policy.yaml").write_text(POLICY.format(deadline=deadline_s, unreachable=unreachable_s))
    lines = "".join(f"    - hotkey: {m.hotkey}\n      url: {m.url}\n      coldkey: {_coldkey(m)}\n" for m in listed)
    (tm_home / "config").mkdir(parents=True, exist_ok=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"bittensor:\n  wallet:\n    name: broker\n    path: {tmp_path / 'wallets'}\n  quote_timeout_s: 5\n"
        f"  miners:\n{lines}")
    return job / "job.yaml", tmp_path / "policy.yaml"


def _coldkey(miner: MinerProcess) -> str:
    return miner.wallet.coldkeypub.ss58_address


def _caught(tm_home, shown: dict, cheater: MinerProcess, spec, policy) -> dict:
    """The cheater's attempt rejected with a reason, unpaid, the cheater banned (hotkey and coldkey) and left
    out of the next job's offers with the ban as the reason; the attempt as `status --json` shows it."""
    ran = {r["id"] for r in state_rows(tm_home, "SELECT id FROM attempts WHERE executor_hotkey = ?", cheater.hotkey)}
    [attempt] = [a for a in shown["attempts"] if a["id"] in ran]
    assert attempt["state"] == "rejected" and attempt["reason"], shown
    assert not state_rows(tm_home, "SELECT * FROM payments WHERE attempt_id = ?", attempt["id"])
    bans = _shown(_tm("executors", "ls", "--json"))["bans"]
    assert {(b["kind"], b["key"]) for b in bans if b["active"]} >= {("hotkey", cheater.hotkey),
                                                                      ("coldkey", _coldkey(cheater))}
    offered = _shown(_tm("offers", str(spec), "--policy", str(policy), "--json"))
    verdicts = {r["offer"]["instance"]: r["verdict"] for r in offered["considered"]}
    assert verdicts[cheater.hotkey] == BANNED, offered
    return attempt

"""The Bittensor backend end to end through the real CLI: `trainmaster submit JOB --wait` under a policy whose
primary is bittensor, with backends.yaml naming real `trainmaster miner serve` processes on 127.0.0.1 (real
wallets made without passwords, every request btauth-signed) and a fixed TAO/USD rate. The job is the
harness's tiny LM (it commits segments): quote → upload → run → signed commitment → challenge → audit →
accept → conclude (countersigned), paid exactly once; a listed miner that is down is left out with its
reason and another is chosen."""

from __future__ import annotations

import json

import pytest

from miner_support import shown as _shown, tm as _tm
from miner_support import MinerProcess, free_port, make_wallet
from tiny_lm_job import EVALUATOR, JOB, TINY_LM, short_job
from trainmaster.wallet.keys import signed_by
from state_rows import state_rows

pytestmark = pytest.mark.slow

PRICES = {"prices": {"rao_per_gpu_hour": {"cpu": 2_000_000_000}}, "default_hours": 0.25}
POLICY = "name: tao\ndefault:\n  primary: bittensor\ntao_rate:\n  usd_per_tao: 400\nverification:\n  tau: 0.01\n"


@pytest.fixture(scope="module")
def miners(tmp_path_factory):
    """Two honest miners for both tests (processes started once, ~10 s each on a loaded machine): each keeps a
    job under its attempt's id and every test has its own broker (home, wallet, state), so the tests never see
    each other's work through them."""
    root = tmp_path_factory.mktemp("miners")
    procs = [MinerProcess(root / f"miner{i}", make_wallet(root / "wallets", f"miner{i}"), config=PRICES).start()
             for i in range(2)]
    yield procs
    for proc in procs:
        proc.stop()


def _setup(tmp_path, tm_home, listed: list[dict]) -> tuple:
    """The job, the policy and backends.yaml (the broker's own wallet beside the miners')."""
    broker = make_wallet(tmp_path / "wallets", "broker")
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.yaml").write_text(JOB.format(entrypoint=TINY_LM.format(steps=100)))
    (job / "evaluate.py").write_text(EVALUATOR)
    (tmp_path / "policy.yaml").write_text(POLICY)
    lines = "".join(f"    - hotkey: {m['hotkey']}\n      url: {m['url']}\n"
                    + (f"      coldkey: {m['coldkey']}\n" if m.get("coldkey") else "") for m in listed)
    (tm_home / "config").mkdir(parents=True)
    (tm_home / "config" / "backends.yaml").write_text(
        f"bittensor:\n  wallet:\n    name: broker\n    path: {tmp_path / 'wallets'}\n  quote_timeout_s: 5\n"
        f"  miners:\n{lines}")
    return broker, job / "job.yaml", tmp_path / "policy.yaml"


def _listed(proc: MinerProcess) -> dict:
    return {"hotkey": proc.hotkey, "url": proc.url, "coldkey": proc.wallet.coldkeypub.ss58_address}


def test_a_job_is_quoted_run_audited_accepted_concluded_and_paid_once_by_a_real_miner(tmp_path, tm_home, miners):
    down = make_wallet(tmp_path / "wallets", "gone")
    listed = [{"hotkey": down.hotkey.ss58_address, "url": f"http://127.0.0.1:{free_port()}"}, *map(_listed, miners)]
    _, spec, policy = _setup(tmp_path, tm_home, listed)
    spec.write_text(short_job(selfcheck=True))  # 4 segments of 10 steps: the whole walk, on a shorter run; the
    # runtime's self-check on, as a user's job has it
    offered = _shown(_tm("offers", str(spec), "--policy", str(policy), "--json"))
    assert {r["offer"]["instance"] for r in offered["considered"]} == {m.hotkey for m in miners}
    [gone] = offered["unavailable"]["bittensor"]  # the miner that is down, with its reason
    assert gone.startswith(f"miner {down.hotkey.ss58_address[:8]}… at {listed[0]['url']} is unreachable"), gone
    done = _tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = _shown(done)
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    assert attempt["backend"] == "bittensor"
    ran = next(m for m in miners if (m.home / "jobs" / attempt["id"]).exists())  # where it ran: one miner's home
    [row] = state_rows(tm_home, "SELECT executor_hotkey, executor_coldkey FROM attempts WHERE id = ?", attempt["id"])
    assert tuple(row) == (ran.hotkey, ran.wallet.coldkeypub.ss58_address)  # the directory's word

    verdict = json.loads((tm_home / "jobs" / shown["id"] / "verdict.json").read_text())
    assert verdict["checks"] == ["integrity", "safety", "replay", "outcome"]
    signature = verdict["evidence"]["integrity"]["signature"]
    assert signature.startswith("valid for ") and ran.hotkey in signature, signature
    assert verdict["evidence"]["replay"]["challenge"]["segments"]  # segments opened over the protocol

    charges = state_rows(tm_home, "SELECT kind, rao FROM ledger_entries WHERE job_id = ? ORDER BY seq", shown["id"])
    assert [c["kind"] for c in charges] == ["reserve", "charge"]
    assert charges[1]["rao"] == 2_000_000_000 * 0.25  # the quoted price of the job's work, not hours × rate
    payments = state_rows(tm_home, "SELECT payee, rao, attempt_id FROM payments WHERE job_id = ?", shown["id"])
    owner = ran.wallet.coldkeypub.ss58_address
    assert [tuple(p) for p in payments] == [(owner, charges[1]["rao"], attempt["id"])]  # once, to the owner

    [told] = state_rows(tm_home,
                        "SELECT receipt, countersignature FROM conclusions WHERE attempt_id = ?", attempt["id"])
    assert signed_by(told["receipt"].encode(), told["countersignature"], ran.hotkey)  # concluded, countersigned
    again = _shown(_tm("status", shown["id"], "--json"))
    assert again["state"] == "accepted"
    assert len(state_rows(tm_home, "SELECT * FROM payments WHERE job_id = ?", shown["id"])) == 1


def test_a_miner_that_kept_few_states_re_makes_them_and_answers_the_sampled_tier(tmp_path, tm_home, miners):
    """checkpoint.keep_every through a real miner process: it keeps S_0, every 3rd, the last two; the challenge
    (over the protocol) makes it re-run from its kept states and open chunks of every boundary; accepted, paid."""
    _, spec, policy = _setup(tmp_path, tm_home, list(map(_listed, miners)))
    spec.write_text(spec.read_text().replace("  segment_steps: 25\n", "  segment_steps: 10\n  keep_every: 3\n"))
    done = _tm("submit", str(spec), "--policy", str(policy), "--wait", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = _shown(done)
    assert shown["state"] == "accepted", shown
    [attempt] = shown["attempts"]
    verdict = json.loads((tm_home / "jobs" / shown["id"] / "verdict.json").read_text())
    replay = verdict["evidence"]["replay"]
    dropped = [i for i in replay["challenge"]["segments"] if i % 3 and i < 9]  # states the miner did not keep
    assert dropped, replay["challenge"]
    opened = tm_home / "jobs" / shown["id"] / "openings"
    for i in dropped:  # re-made by the miner from its kept states, each checked against its leaf by the audit
        assert list(opened.glob(f"*/segments/{i:08d}/weights.safetensors")), i
    assert len(list(opened.glob("*/chunks/*.json"))) == 11
    assert replay["tier"] == "sampled" and replay["boundaries"]["passed"]
    assert replay["boundaries"]["boundaries"] == 11  # n = 100 / 10 segments: every boundary opened over the protocol
    assert len(state_rows(tm_home, "SELECT * FROM payments WHERE job_id = ?", shown["id"])) == 1

"""Offers asked with context and expiring (#15 §6), through the CLI: an expired planned offer is quoted
again at dispatch; each quote carries its evidence and, for TAO prices, the broker's rate and when it was
taken (stale ones flagged); egress is priced from declared data sizes, the audit overhead from the job's
own total steps; a backend lacking a feature the job needs is gated out by the broker, with its reason."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from trainmaster.backends.base import Offer, OfferRequest, OfferSet
from trainmaster.broker.planning.gating import gate
from trainmaster.broker.planning.planner import Plan, plan
from trainmaster.broker.planning.stored_plan import StoredPlan, requote
from trainmaster.broker.planning.policy import Policy
from trainmaster.jobs.spec import JobSpec

from clouds.ready import ready_clouds  # noqa: F401 - the fixture

ENV = {"COLUMNS": "200"}
WRITES = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ran')\n"


def tm(*args: str, home) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRAINMASTER_HOME": str(home), **ENV}
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def policy_file(tmp_path, body: str):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\n" + textwrap.dedent(body))
    return path


def test_an_expired_planned_offer_is_quoted_again_at_dispatch(tm_home, job_factory, tmp_path):
    spec = job_factory(WRITES, "estimated_hours: 0.001\n")
    policy = policy_file(tmp_path, "offers:\n  valid_s: 0.001\n")
    done = tm("submit", str(spec), "--policy", str(policy), "--wait", "--json", home=tm_home)
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    shown = json.loads(tm("status", job["id"], "--json", home=tm_home).stdout)
    assert shown["state"] == "accepted"
    kinds = [e["kind"] for e in shown["events"]]
    [requoted] = [e["detail"] for e in shown["events"] if e["kind"] == "requoted"]
    assert kinds.index("requoted") < kinds.index("attempt")  # quoted again before the attempt was dispatched
    assert requoted["outcome"] == "same offer" and requoted["chosen"] == requoted["offer"]
    assert requoted["expected_micro_usd"] <= requoted["planned_micro_usd"]
    [planned] = [e["detail"] for e in shown["events"] if e["kind"] == "transition" and e["to"] == "planned"]
    assert requoted["quote"]["at"] > planned["quote"]["at"]  # a new quote, not the one the plan was made on
    assert planned["quote"]["by"] == "local" and planned["quote"]["source"] == "power model"


def test_an_offer_that_still_holds_is_dispatched_without_a_second_quote(tm_home, job_factory):
    spec = job_factory(WRITES, "estimated_hours: 0.001\n")
    job = json.loads(tm("submit", str(spec), "--wait", "--json", home=tm_home).stdout)
    shown = json.loads(tm("status", job["id"], "--json", home=tm_home).stdout)
    assert "requoted" not in [e["kind"] for e in shown["events"]]
    [planned] = [e["detail"] for e in shown["events"] if e["kind"] == "transition" and e["to"] == "planned"]
    assert planned["valid_until"] == pytest.approx(planned["quote"]["at"] + 600)  # the policy's default validity


def _stored(cost: int) -> StoredPlan:
    offer = Offer(backend="local", instance="h", price_per_hour_micro_usd=cost, valid_until=1.0)
    return StoredPlan(seq=1, offer=offer, hours=1.0, expected_micro_usd=cost, basis="b", offers=1, considered=[])


def _fresh(*offers: Offer) -> Plan:
    return plan(JobSpec(name="x", entrypoint="python t.py", estimated_hours=1), Policy(name="p"),
                [OfferSet(backend="local", offers=list(offers))])


def test_requote_keeps_the_same_offer_within_the_plan_else_replans():
    stored = _stored(1000)
    same = Offer(backend="local", instance="h", trusted=True, price_per_hour_micro_usd=900)
    kept = requote(stored, _fresh(same))
    assert (kept.seq, kept.offer.key, kept.expected_micro_usd) == (1, stored.offer.key, 900)
    dearer = Offer(backend="local", instance="h", trusted=True, price_per_hour_micro_usd=1100)
    assert requote(stored, _fresh(dearer)).seq == 2  # above the plan: a new plan, on what is best now
    other = Offer(backend="local", instance="other", trusted=True, price_per_hour_micro_usd=2000)
    replanned = requote(stored, _fresh(other))
    assert (replanned.seq, replanned.offer.instance) == (2, "other")
    assert requote(stored, _fresh()) is None


# the rate: recorded with every TAO quote and with the charge, stale ones flagged

JOB = """\
name: lm
entrypoint: python -m trainmaster.jobs.recipes.tiny_lm --steps 100 --d-model 32 --layers 1 --seq-len 16 --batch-size 8 --warmup 10
seed: 3
checkpoint:
  segment_steps: 25
"""


@pytest.fixture
def harness(monkeypatch):
    """The registry's bittensor entry pointing at the untrusted harness (tests/untrusted_backend.py)."""
    from trainmaster.backends import registry

    target = "untrusted_backend:UntrustedExecutor"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=target))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", target)


def _cli(*args: str):
    from trainmaster.broker.cli import app

    return CliRunner().invoke(app, list(args), env=ENV)


def test_a_stale_rate_source_is_recorded_and_flagged_in_each_tao_quote(tm_home, tmp_path, harness):
    (tmp_path / "job.yaml").write_text(JOB)
    rate = tmp_path / "rate.json"
    taken = time.time() - 7200
    rate.write_text(json.dumps({"micro_usd_per_tao": 250_000_000, "at": taken}))
    policy = policy_file(tmp_path, f"default:\n  primary: bittensor\ntao_rate:\n  source: {rate}\n  max_age_s: 3600\n")
    shown = _cli("offers", str(tmp_path / "job.yaml"), "--policy", str(policy), "--json")
    offered = json.loads(shown.output)
    quote = offered["quotes"]["bittensor"]
    assert quote["rate"] == {"micro_usd_per_tao": 250_000_000, "rate_at": taken, "rate_source": str(rate),
                             "rate_stale": True}
    assert quote["by"] == "bittensor" and quote["valid_until"] == quote["at"] + 600
    chosen = offered["considered"][0]["offer"]
    assert chosen["price_per_hour_micro_usd"] == 2 * 250_000_000  # 2 TAO an hour, priced at the broker's rate


def test_an_unreadable_rate_source_leaves_tao_prices_unrated_and_says_why(tm_home, tmp_path, harness):
    (tmp_path / "job.yaml").write_text(JOB)
    policy = policy_file(tmp_path, f"default:\n  primary: bittensor\ntao_rate:\n  source: {tmp_path / 'none.json'}\n")
    offered = json.loads(_cli("offers", str(tmp_path / "job.yaml"), "--policy", str(policy), "--json").output)
    assert any("TAO/USD rate:" in note and "none.json" in note for note in offered["notes"])
    assert offered["quotes"]["bittensor"]["rate"] == {}


def test_a_rate_source_url_is_read_over_http_and_a_failing_one_says_why(tm_home, tmp_path, harness):
    """The policy's `tao_rate.source` as an http:// URL (wallet/rates.py over aiohttp, on the planner's loop)."""
    from aiohttp import web

    from served_app import ServedApp

    taken = time.time()

    async def rate(_):
        return web.json_response({"micro_usd_per_tao": 300_000_000, "at": taken})

    async def broken(_):
        return web.Response(status=503, text="maintenance")

    app = web.Application()
    app.add_routes([web.get("/tao.json", rate), web.get("/broken.json", broken)])
    served = ServedApp(app)
    try:
        (tmp_path / "job.yaml").write_text(JOB)
        policy = policy_file(tmp_path, f"default:\n  primary: bittensor\ntao_rate:\n  source: {served.url}/tao.json\n")
        offered = json.loads(_cli("offers", str(tmp_path / "job.yaml"), "--policy", str(policy), "--json").output)
        assert offered["quotes"]["bittensor"]["rate"] == {"micro_usd_per_tao": 300_000_000, "rate_at": taken,
                                                          "rate_source": f"{served.url}/tao.json", "rate_stale": False}
        policy = policy_file(tmp_path, f"default:\n  primary: bittensor\ntao_rate:\n  source: {served.url}/broken.json\n")
        offered = json.loads(_cli("offers", str(tmp_path / "job.yaml"), "--policy", str(policy), "--json").output)
        assert any("TAO/USD rate:" in note and "broken.json: cannot read the rate: HTTP 503" in note
                   for note in offered["notes"]), offered["notes"]
        assert offered["quotes"]["bittensor"]["rate"] == {}
    finally:
        served.stop()


@pytest.mark.slow
def test_the_rate_is_recorded_at_offer_and_at_settle(tm_home, tmp_path, harness):
    (tmp_path / "job.yaml").write_text(JOB)
    policy = policy_file(tmp_path, "default:\n  primary: bittensor\nverification:\n  tau: 0.01\n"
                                   "tao_rate:\n  usd_per_tao: $500\n")
    done = _cli("submit", str(tmp_path / "job.yaml"), "--policy", str(policy), "--wait", "--json")
    assert done.exit_code == 0, done.output
    job = json.loads(done.output[done.output.index("{"):])
    events = json.loads(_cli("status", job["id"], "--json").output)["events"]
    [planned] = [e["detail"] for e in events if e["kind"] == "transition" and e["to"] == "planned"]
    [settled] = [e["detail"] for e in events if e["kind"] == "rate"]
    assert planned["quote"]["micro_usd_per_tao"] == 500_000_000 and planned["quote"]["rate_stale"] is False
    assert (settled["at"], settled["micro_usd_per_tao"], settled["rate_stale"]) == ("settle", 500_000_000, False)
    assert settled["rate_at"] >= planned["quote"]["rate_at"]
    from trainmaster.broker import paths
    from trainmaster.wallet.ledger import Ledger

    with Ledger(paths.state_db()) as ledger:
        [charge] = [e for e in ledger.entries() if e.job_id == job["id"] and e.kind == "charge"]
    assert charge.micro_usd == math.ceil(charge.rao * 500_000_000 / 10**9)
    assert charge.detail["rate_stale"] is False and charge.detail["rate_at"] == settled["rate_at"]


# what the planner is given: data sizes and total steps

def _offers(tmp_path, spec: str, policy: str = "name: d\n") -> dict:
    (tmp_path / "train.py").write_text("print('x')\n")
    (tmp_path / "job.yaml").write_text(textwrap.dedent(spec))
    (tmp_path / "pol.yaml").write_text(policy)
    return json.loads(_cli("offers", str(tmp_path / "job.yaml"), "--policy", str(tmp_path / "pol.yaml"), "--json").output)


CLOUD_POLICY = "name: c\ndefault:\n  primary: aws\n  constraints: {spot_allowed: false}\n"
DATA_JOB = """\
name: d
entrypoint: python train.py
estimated_hours: 1
resources: {{gpus: 1, gpu_types: [A100]}}
data:
  - name: corpus
    source: gs://bucket/corpus.tar
{size}"""


def test_egress_is_priced_when_the_spec_declares_the_data_size(tm_home, tmp_path, ready_clouds):
    sized = _offers(tmp_path, DATA_JOB.format(size="    size_bytes: 100000000000\n"), CLOUD_POLICY)
    unsized = _offers(tmp_path, DATA_JOB.format(size=""), CLOUD_POLICY)
    assert sized["considered"][0]["transfer_micro_usd"] > 0  # 100 GB out of GCP into AWS
    assert unsized["considered"][0]["transfer_micro_usd"] == 0
    assert any("egress is not priced" in n for n in unsized["notes"])
    assert not any("egress is not priced" in n for n in sized["notes"])


AUDITED_JOB = """\
name: a
entrypoint: python train.py {steps}
estimated_hours: 1
verification: {{replay_audit: always, challenge_segments: 8}}
checkpoint: {{segment_steps: 25}}
"""


@pytest.mark.parametrize("steps, fraction", [("--steps 1000", (250, 1000)), ("", (250, 400 * 25))])
def test_the_audit_overhead_is_priced_from_the_jobs_total_steps(tm_home, tmp_path, steps, fraction):
    chosen = _offers(tmp_path, AUDITED_JOB.format(steps=steps))["considered"][0]
    num, den = fraction  # (q+2)·k / T, with T = 400 segments of k when the job does not say
    assert chosen["verification_micro_usd"] == -(-chosen["compute_micro_usd"] * num // den)


# gating: the broker's one check of needed features against what a backend supports

def test_the_broker_gates_a_backend_lacking_a_needed_feature_with_its_reasons(tm_home, tmp_path):
    offered = _offers(tmp_path, """\
        name: g
        entrypoint: python train.py
        resources: {nodes: 2}
        data:
          - name: corpus
            source: s3://bucket/corpus.tar
    """)
    assert offered["chosen"] is None
    assert offered["unavailable"]["local"] == [
        "multi_node: runs on this machine only",
        "remote_data: reads local paths only; copy s3://, gs:// or az:// data down first",
    ]


def test_gate_uses_a_backends_own_limits_for_the_request():
    from trainmaster.backends.local import LocalBackend

    class Picky(LocalBackend):
        def lacks(self, request):
            return {"multi_gpu": "not for this request"}

    spec = JobSpec(name="x", entrypoint="python t.py", resources={"gpus": 2})
    assert gate(LocalBackend(), OfferRequest(spec=spec)) == []
    assert gate(Picky(), OfferRequest(spec=spec)) == ["multi_gpu: not for this request"]
    assert gate(Picky(), OfferRequest(spec=JobSpec(name="x", entrypoint="python t.py"))) == []


def test_the_broker_stamps_the_chosen_offer_with_its_quote_and_never_trusts_the_backends_who_or_when():
    from trainmaster.backends.base import Quoting

    quoting = Quoting(by="bittensor", at=100.0, valid_until=700.0, rate={"micro_usd_per_tao": 1, "rate_stale": False})
    tao = Offer(backend="bittensor", instance="h", price_per_hour_micro_usd=1, price_per_hour_rao=5,
                valid_until=300.0, quote={"source": "miner", "by": "local", "at": 1e12})
    stamped = quoting.stamp(tao)
    assert stamped.valid_until == 300.0  # the offer's own, earlier, validity holds
    assert stamped.quote == {"source": "miner", "micro_usd_per_tao": 1, "rate_stale": False, "by": "bittensor",
                             "at": 100.0}
    usd = Offer(backend="bittensor", instance="h", price_per_hour_micro_usd=1, valid_until=9e9)
    assert quoting.stamp(usd).valid_until == 700.0 and "micro_usd_per_tao" not in quoting.stamp(usd).quote

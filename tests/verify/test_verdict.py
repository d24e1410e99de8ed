"""Verdicts: the model, verdict.json, and the records in the broker's state.db."""

from __future__ import annotations

import sqlite3

import pytest

from trainmaster.verify.errors import VerificationError
from trainmaster.verify.records import SCHEMA_VERSION, Database, SecretStore, VerdictStore
from trainmaster.verify.verdict import Verdict, read_verdict


def verdict(outcome="accepted", **kw) -> Verdict:
    return Verdict(outcome=outcome, checks=["integrity", "safety"], job_id="job-1", attempt_id="a1", **kw)


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "home" / "state.db"


def test_exit_codes():
    assert [verdict(o).exit_code for o in ("accepted", "rejected", "cannot_verify")] == [0, 1, 2]
    assert verdict().accepted and not verdict("rejected").accepted


def test_unknown_outcome_is_refused():
    with pytest.raises(ValueError):
        Verdict(outcome="maybe")


def test_verdict_json_round_trip(tmp_path):
    v = verdict("rejected", reasons=["model.pt: pickle"], evidence={"safety": {"files": 3}})
    path = v.write(tmp_path / "job" / "verdict.json")
    assert read_verdict(path) == v
    assert not list(path.parent.glob(".*.tmp"))


def test_store_and_read_back(db_path):
    store = VerdictStore(db_path)
    first = verdict("cannot_verify", reasons=["evaluator crashed"])
    second = verdict("accepted", evidence={"outcome": {"metrics": {"a": 1.0}}})
    store.record(first)
    store.record(second)
    assert store.latest("job-1") == second
    assert store.latest("job-1", "a1") == second
    assert store.latest("job-1", "a2") is None
    assert store.history("job-1") == [first, second]
    assert store.latest("job-2") is None
    store.close()


def test_record_needs_a_job_id(db_path):
    with pytest.raises(ValueError, match="job id"):
        VerdictStore(db_path).record(Verdict(outcome="accepted"))


def test_resolve_job_by_exact_id_or_unique_prefix(db_path):
    store = VerdictStore(db_path)
    for job in ("train-abc123", "train-abd456", "other-1"):
        store.record(verdict(), job_id=job)
    assert store.resolve_job("train-abc123") == "train-abc123"
    assert store.resolve_job("train-abc") == "train-abc123"
    assert store.resolve_job("train-ab") is None  # ambiguous
    assert store.resolve_job("nope") is None


def test_schema_is_versioned_and_wal(db_path):
    VerdictStore(db_path).close()
    VerdictStore(db_path).close()  # idempotent
    db = sqlite3.connect(db_path)
    assert db.execute("SELECT version FROM verify_schema").fetchall() == [(SCHEMA_VERSION,)]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"verdicts", "commitments", "challenge_secrets", "verify_schema"} <= tables


def test_newer_schema_is_refused(db_path):
    VerdictStore(db_path).close()
    db = sqlite3.connect(db_path)
    db.execute("UPDATE verify_schema SET version = 99")
    db.commit()
    with pytest.raises(VerificationError, match="schema version 99") as caught:
        Database(db_path)
    assert caught.value.kind == "cannot_verify"


def test_shares_state_db_with_the_broker(tm_home):
    from trainmaster.broker import paths
    from trainmaster.broker.store import Store

    broker_store = Store(paths.state_db())
    verdicts = VerdictStore(paths.state_db())
    verdicts.record(verdict())
    assert verdicts.latest("job-1").accepted
    broker_store.close()
    verdicts.close()
    Store(paths.state_db()).close()  # the broker's migrations still open the shared file
    assert VerdictStore(paths.state_db()).latest("job-1").accepted


def test_secret_is_stable_and_revealed_only_after_the_verdict(db_path):
    import hashlib

    secrets, verdicts = SecretStore(db_path), VerdictStore(db_path)
    secret = secrets.secret_for("job-1", "a1")
    assert secrets.secret_for("job-1", "a1") == secret
    assert secrets.secret_for("job-1", "a2") != secret  # one per attempt
    assert secrets.digest("job-1", "a1") == hashlib.sha256(secret).hexdigest()
    with pytest.raises(VerificationError, match="only after its verdict"):
        secrets.reveal("job-1", "a1")
    verdicts.record(verdict("rejected"))
    assert secrets.reveal("job-1", "a1") == secret
    with pytest.raises(VerificationError, match="only after its verdict"):
        secrets.reveal("job-1", "a2")


# the pipeline that reaches a verdict

import json  # noqa: E402
import shutil  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from trainmaster.jobs.recipe import Recipe, RecipeConfig  # noqa: E402
from trainmaster.jobs.spec import JobSpec  # noqa: E402
from trainmaster.jobs.state import TrainState  # noqa: E402
from trainmaster.verify.pipeline import Attempt, AuditSettings, default_checks, verify_attempt  # noqa: E402
from trainmaster.verify import safeload  # noqa: E402
from trainmaster.verify.recipe_run import RecipeRun  # noqa: E402

JOB, BUNDLE, K, STEPS = "job-1", "cc" * 32, 2, 6


class TinyConfig(RecipeConfig):
    lr: float = 0.1


class TinyLinear:
    """Linear regression by hand-written SGD: a real run on the runtime in well under a second."""

    def __init__(self, config: TinyConfig, seed: int):
        self.config, self.w = config, torch.zeros(3)

    def step(self, ctx):
        x = torch.randn(8, 3, generator=ctx.generator("data"))
        y = x @ torch.tensor([1.0, -2.0, 0.5])
        self.w -= self.config.lr * 2 * x.T @ (x @ self.w - y) / len(x)
        return {"loss": float(((x @ self.w - y) ** 2).mean())}

    def state(self):
        return TrainState(weights={"w": self.w}, rest={})

    def load_state(self, state):
        self.w = state.weights["w"].clone()

    def result(self):
        return {"w_norm": float(self.w.norm())}


class LazyLinear(TinyLinear):
    """A cheat: trains with 0.9 × the spec's lr while its states record the spec's config."""

    def __init__(self, config: TinyConfig, seed: int):
        super().__init__(config.model_copy(update={"lr": config.lr * 0.9}), seed)


TINY = Recipe(name="tiny-linear", config_type=TinyConfig, build=TinyLinear)
TINY_RUN = RecipeRun(TINY, TinyConfig(steps=STEPS).model_dump(mode="json"), 1, K)


def train(directory: Path, build) -> Path:
    from trainmaster.jobs.runtime import RuntimeSettings, run

    out = directory / "outputs"
    settings = RuntimeSettings(job_id=JOB, output_dir=out, checkpoint_dir=out / "checkpoints", seed=1,
                               segment_steps=K, bundle_sha256=BUNDLE)
    run(Recipe(name="tiny-linear", config_type=TinyConfig, build=build), TinyConfig(steps=STEPS), settings)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("honest"), TinyLinear)


@pytest.fixture(scope="module")
def cheated(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("lazy"), LazyLinear)


@pytest.fixture
def outputs(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "job" / "outputs"))


@pytest.fixture(scope="module")
def miner():
    from bittensor.sp_core import Keypair

    return Keypair.create_from_mnemonic(Keypair.generate_mnemonic())


def spec(**verification) -> JobSpec:
    return JobSpec(name="t", entrypoint="python train.py", checkpoint={"segment_steps": K},
                   verification={"challenge_segments": 1, **verification})


def untrusted(outputs: Path, miner, **kw) -> Attempt:
    from trainmaster.jobs.commitment import read_commitment
    from trainmaster.jobs.signing import sign_commitment

    signature = sign_commitment(read_commitment(outputs / "commitment.json"), miner)
    fields = dict(job_id=JOB, attempt_id="a1", outputs=outputs, bundle_sha256=BUNDLE, spec=spec(), trusted=False,
                  hotkey=miner.ss58_address, signature=signature, recipe_run=TINY_RUN,
                  expected_weights={"w": ("F32", (3,))})
    return Attempt(**{**fields, **kw})


TAU = AuditSettings(tau=1e-3)
ISOLATED = safeload.check_files_isolated


@pytest.fixture(autouse=True)
def in_process_safety(monkeypatch):
    """Files are checked in this process here (~0.5 s less per test); the child process is tested in
    test_safeload.py, and with the whole pipeline by tests that ask for ``isolated_safety``."""
    monkeypatch.setattr(safeload, "check_files_isolated", lambda files, **kwargs: safeload.check_files(files, **kwargs))


@pytest.fixture
def isolated_safety(monkeypatch):
    monkeypatch.setattr(safeload, "check_files_isolated", ISOLATED)


def crashing_audit(**kwargs):
    raise RuntimeError("out of memory")


def test_default_checks():
    assert default_checks(trusted=True) == {"integrity", "safety", "outcome"}
    assert default_checks(trusted=False) == {"integrity", "safety", "replay", "outcome"}


def test_trusted_run_is_accepted_stored_and_written(outputs, db_path, isolated_safety):
    attempt = Attempt(job_id=JOB, attempt_id="a1", outputs=outputs, bundle_sha256=BUNDLE, spec=spec(), trusted=True)
    verdict = verify_attempt(attempt, db_path=db_path)
    assert verdict.outcome == "accepted", verdict.reasons
    assert verdict.checks == ["integrity", "safety", "outcome"]
    assert read_verdict(outputs.parent / "verdict.json") == verdict
    assert VerdictStore(db_path).latest(JOB, "a1") == verdict
    assert verdict.evidence["integrity"]["signature"] == "not required (trusted executor)"
    assert "model.safetensors" in verdict.evidence["safety"]["safetensors_checked"]


def test_untrusted_run_is_audited_on_a_stored_commitment(outputs, miner, db_path):
    from trainmaster.verify.commitments import CommitmentStore

    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "accepted", verdict.reasons
    assert verdict.checks == ["integrity", "safety", "replay", "outcome"]
    replay = verdict.evidence["replay"]
    assert replay["challenge"]["segments"] == [0, 1, 2]  # n = T/k = 3: every segment
    assert replay["passed"] and replay["tau"] == 1e-3 and [s["index"] for s in replay["segments"]] == [0, 1, 2]
    assert verdict.evidence["integrity"]["signature"] == f"valid for {miner.ss58_address}"
    assert CommitmentStore(db_path).get(JOB, "a1").hotkey == miner.ss58_address


def test_our_deterministic_backend_must_replay_exactly(outputs, db_path):
    attempt = Attempt(JOB, "a1", outputs, BUNDLE, spec=spec(), trusted=True, recipe_run=TINY_RUN, exact_replay=True)
    verdict = verify_attempt(attempt, checks={"integrity", "safety", "replay"}, db_path=db_path)
    assert verdict.outcome == "accepted", verdict.reasons
    assert verdict.evidence["replay"]["tau_source"] == "exact"


def test_lazy_executor_is_caught_by_the_audit(cheated, tmp_path, miner, db_path):
    outputs = Path(shutil.copytree(cheated, tmp_path / "lazy" / "outputs"))
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected"
    assert verdict.reasons[0].startswith("the replay audit failed: segment ")
    assert "exceeds τ" in verdict.reasons[0]
    assert verdict.evidence["replay"]["passed"] is False


def test_uncalibrated_audit_cannot_verify(outputs, miner, db_path):
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path)
    assert verdict.outcome == "cannot_verify" and "uncalibrated" in verdict.reasons[0]


def test_audit_needs_openings(outputs, miner, db_path):
    shutil.rmtree(outputs / "checkpoints")
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "cannot_verify" and "no openings" in verdict.reasons[0]


def test_signature_file_is_read_when_none_is_passed(outputs, miner, db_path):
    attempt = untrusted(outputs, miner)
    (outputs / "commitment.sig").write_text(attempt.signature + "\n")
    attempt = untrusted(outputs, miner, signature=None)
    assert verify_attempt(attempt, db_path=db_path, audit_settings=TAU).accepted


def test_wrong_signer_is_rejected_before_any_audit(outputs, miner, db_path):
    from bittensor.sp_core import Keypair

    other = Keypair.create_from_mnemonic(Keypair.generate_mnemonic())
    verdict = verify_attempt(untrusted(outputs, miner, hotkey=other.ss58_address), db_path=db_path, audit=crashing_audit)
    assert verdict.outcome == "rejected" and "not valid for the dispatched hotkey" in verdict.reasons[0]
    assert verdict.checks == ["integrity", "safety"]  # safety still runs, to report every fault together


def test_wrong_n_is_rejected(outputs, miner, db_path):
    verdict = verify_attempt(untrusted(outputs, miner, total_steps=8), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "T/k is 4" in verdict.reasons[0]


def test_unknown_total_steps_cannot_verify_an_untrusted_run(outputs, miner, db_path):
    verdict = verify_attempt(untrusted(outputs, miner, recipe_run=None), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "cannot_verify" and "T are unknown" in verdict.reasons[0]


def test_final_weights_not_the_committed_ones_are_rejected(outputs, miner, db_path):
    from trainmaster.jobs.canonical import serialize

    (outputs / "model.safetensors").write_bytes(serialize({"w": torch.ones(3)}))
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "final_sha256" in verdict.reasons[0]


def test_changed_outputs_are_rejected(outputs, miner, db_path):
    recorded = (("result.json", (outputs / "result.json").stat().st_size, "00" * 32),)
    verdict = verify_attempt(untrusted(outputs, miner, recorded_outputs=recorded), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "output result.json does not match" in verdict.reasons[0]


def test_no_commitment_from_an_untrusted_executor_is_rejected(outputs, miner, db_path):
    attempt = untrusted(outputs, miner)
    (outputs / "commitment.json").unlink()
    verdict = verify_attempt(attempt, db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "cannot be audited" in verdict.reasons[0]


@pytest.mark.parametrize("name", ["extra.pt", "policy.pkl", "weights.npy", "sub/model.bin"])
def test_model_like_files_are_refused(outputs, miner, db_path, name):
    (outputs / name).parent.mkdir(exist_ok=True)
    (outputs / name).write_bytes(b"anything")
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and f"{name} is a {Path(name).suffix} file" in verdict.reasons[0]
    assert "refused from untrusted compute" in verdict.reasons[0]
    assert verdict.checks == ["integrity", "safety"]


def test_pickle_under_another_name_is_refused(outputs, miner, db_path):
    import pickle

    (outputs / "notes.txt").write_bytes(pickle.dumps({"a": 1}))
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "notes.txt is a pickle" in verdict.reasons[0]


def test_nan_in_a_returned_checkpoint_is_rejected(outputs, miner, db_path, isolated_safety):
    from safetensors.torch import save_file

    save_file({"x": torch.tensor([1.0, float("nan")])}, str(outputs / "extra.safetensors"))
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "extra.safetensors: tensor 'x' holds NaN" in verdict.reasons[0]


def test_weights_with_unexpected_tensors_are_rejected(outputs, miner, db_path):
    attempt = untrusted(outputs, miner, expected_weights={"w": ("F32", (4,))})
    verdict = verify_attempt(attempt, db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "expected F32[4]" in verdict.reasons[0]


def test_a_crash_anywhere_is_cannot_verify_never_accept(outputs, miner, db_path):
    verdict = verify_attempt(untrusted(outputs, miner), db_path=db_path, audit=crashing_audit)
    assert verdict.outcome == "cannot_verify"
    assert verdict.reasons == ["the replay check failed to run: RuntimeError: out of memory"]
    assert VerdictStore(db_path).latest(JOB).outcome == "cannot_verify"


def test_replay_without_a_database_cannot_verify(outputs, miner):
    verdict = verify_attempt(untrusted(outputs, miner), audit_settings=TAU)
    assert verdict.outcome == "cannot_verify" and "needs the database" in verdict.reasons[0]


def test_outcome_below_threshold_is_rejected_with_its_metrics(outputs, miner, db_path, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "evaluate.py").write_text(textwrap.dedent("""
        import json, math, os, struct
        raw = open(os.environ["TRAINMASTER_EVAL_CHECKPOINT"], "rb").read()
        (n,) = struct.unpack_from("<Q", raw)
        begin, end = json.loads(raw[8 : 8 + n])["w"]["data_offsets"]
        w = struct.unpack("<3f", raw[8 + n + begin : 8 + n + end])
        print(json.dumps({"neg_error": -math.dist(w, (1.0, -2.0, 0.5))}))
    """))
    attempt = untrusted(outputs, miner, spec=spec(evaluator="python evaluate.py", thresholds={"neg_error": -0.01}),
                        code_dir=code)
    verdict = verify_attempt(attempt, db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "rejected" and "neg_error" in verdict.reasons[0]
    assert verdict.evidence["outcome"]["metrics"]["neg_error"] < -0.01
    lenient = untrusted(outputs, miner, spec=spec(evaluator="python evaluate.py", thresholds={"neg_error": -10.0}),
                        code_dir=code)
    assert verify_attempt(lenient, db_path=db_path, audit_settings=TAU).accepted


def test_an_untrusted_executors_own_result_json_never_passes_thresholds(outputs, miner, db_path):
    (outputs / "result.json").write_text(json.dumps({"w_norm": 1e300}))
    attempt = untrusted(outputs, miner, spec=spec(thresholds={"w_norm": 0.0}))
    verdict = verify_attempt(attempt, db_path=db_path, audit_settings=TAU)
    assert verdict.outcome == "cannot_verify", verdict
    assert "self-reported metrics from untrusted outputs are not evidence" in verdict.reasons[0]


def test_unknown_check_is_a_usage_error(outputs):
    with pytest.raises(ValueError, match="unknown checks"):
        verify_attempt(Attempt(JOB, "a1", outputs, BUNDLE), checks={"integrity", "vibes"})


def test_missing_outputs_cannot_verify(tmp_path):
    verdict = verify_attempt(Attempt(JOB, "a1", tmp_path / "nope", BUNDLE, trusted=True), write_verdict=False)
    assert verdict.outcome == "cannot_verify" and "does not exist" in verdict.reasons[0]
    assert json.loads(verdict.to_json())["outcome"] == "cannot_verify"

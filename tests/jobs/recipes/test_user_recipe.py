"""A job's own Recipe, end to end through the CLI: `recipe: myrecipe:RECIPE` in the spec, the script
calling the runtime. The audit re-executes it in a child process from the verified bundle (never in the
broker's process), a run whose `state()` misses something fails its self-check, a cheat on untrusted
compute is rejected, a changed code directory is refused, and a 2-process run is refused up front."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import textwrap
import time

import pytest
from typer.testing import CliRunner

from background_support import polled
from trainmaster.broker import paths
from trainmaster.broker.cli import app
from untrusted_backend import UntrustedExecutor

RECIPE = '''\
"""A job's own recipe: linear regression, SGD with momentum, batches from (seed, step)."""
import os
import sys

import torch

from trainmaster.jobs.recipe import Recipe, RecipeConfig, StateRules
from trainmaster.jobs.state import (
    TrainState, load_optimizer_state, module_state, optimizer_rules, optimizer_state, prefixed, section,
)

if os.environ.get("RECIPE_MARKER"):  # who imports this module: the job, its self-check, the audit's child
    with open(os.environ["RECIPE_MARKER"], "a") as marker:
        marker.write(f"{os.getpid()} {' '.join(sys.argv)}\\n")

    def _report():  # and, as each ends, whether it loaded torch's compiler stack (torch._dynamo)
        with open(os.environ["RECIPE_MARKER"], "a") as marker:
            marker.write(f"{os.getpid()} exit dynamo={'torch._dynamo.eval_frame' in sys.modules}\\n")

    import atexit
    atexit.register(_report)


class LinConfig(RecipeConfig):
    lr: float = 0.05
    features: int = 4


class LinTrainer:
    def __init__(self, config, seed):
        self.truth = torch.randn(config.features, 1, generator=torch.Generator().manual_seed(seed))
        self.model = torch.nn.Linear(config.features, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr, momentum=0.9)

    def batch(self, ctx):
        return torch.randn(16, self.truth.shape[0], generator=ctx.generator("data"))

    def step(self, ctx):
        x = self.batch(ctx)
        loss = ((self.model(x) - x @ self.truth) ** 2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": float(loss.detach())}

    def state(self):
        return TrainState(weights=module_state(self.model), rest=prefixed("optimizer", optimizer_state(self.optimizer)))

    def load_state(self, state):
        self.model.load_state_dict(state.weights)
        load_optimizer_state(self.optimizer, section("optimizer", state.rest))

    def result(self):
        return {}


class ShuffledTrainer(LinTrainer):
    """Batches from a fixed data set reshuffled every epoch, as DataLoader(shuffle=True) does: the shuffling
    generator and the epoch's iterator are Python attributes that state() does not return."""

    def __init__(self, config, seed):
        super().__init__(config, seed)
        self.data = torch.randn(64, config.features, generator=torch.Generator().manual_seed(seed + 1))
        self.shuffle = torch.Generator().manual_seed(seed)
        self.batches = iter(())

    def batch(self, ctx):
        index = next(self.batches, None)
        if index is None:
            self.batches = iter(torch.randperm(64, generator=self.shuffle).split(16))
            index = next(self.batches)
        return self.data[index]


RULES = StateRules(fields=optimizer_rules("optimizer"))
RECIPE = Recipe(name="linreg", config_type=LinConfig, build=LinTrainer, rules=RULES)
HIDDEN = Recipe(name="linreg", config_type=LinConfig, build=ShuffledTrainer, rules=RULES)
'''

TRAIN = '''\
import sys

from myrecipe import {attr}
from trainmaster.jobs.recipes.cli import main

if __name__ == "__main__":
    sys.exit(main({attr}))
'''

JOB = """\
name: linreg
entrypoint: python train.py --steps 100 --lr 0.05
recipe: myrecipe:{attr}
seed: 2
env:
  RECIPE_MARKER: {marker}
checkpoint:
  segment_steps: 25
verification:
  replay_audit: always
  challenge_segments: 2
"""

POLICY = """\
name: untrusted
default:
  primary: bittensor
verification:
  tau: 0.01
"""


def _job(root, *, attr="RECIPE", extra=""):
    code = root / "code"
    code.mkdir(parents=True)
    (code / "myrecipe.py").write_text(RECIPE)
    (code / "train.py").write_text(TRAIN.format(attr=attr))
    (code / "job.yaml").write_text(JOB.format(attr=attr, marker=root / "marker.txt") + textwrap.dedent(extra))
    return code / "job.yaml"


def _submit(*args, env: dict | None = None):
    out = CliRunner().invoke(app, ["submit", *map(str, args), "--json"], env=env)
    shown = json.loads(out.output[out.output.index("{"):]) if "{" in out.output else None
    return out, shown


def _marker_lines(root) -> list[str]:
    path = root / "marker.txt"
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_an_own_recipe_is_audited_in_a_child_process_and_accepted(tm_home, tmp_path):
    out, job = _submit(_job(tmp_path), "--wait")
    assert out.exit_code == 0, out.output
    verdict = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())
    assert verdict["outcome"] == "accepted" and verdict["checks"] == ["integrity", "safety", "replay", "outcome"]
    replay = verdict["evidence"]["replay"]
    assert replay["recipe"] == "linreg" and replay["tau_source"] == "exact"
    assert [s["index"] for s in replay["segments"]] == [0, 1, 2, 3]  # first, last and q = 2 drawn from 1..2
    assert all(s["passed"] and s["r"] == 0 for s in replay["segments"])
    # the broker never imported the job's code; the job, its self-check and the audit's child did
    assert "myrecipe" not in sys.modules
    lines = _marker_lines(tmp_path)
    assert lines and all(int(line.split()[0]) != os.getpid() for line in lines), lines
    assert any("train.py" in line for line in lines)
    assert any("selfcheck" in line for line in lines)
    assert any("recipe_audit" in line for line in lines)
    # each of them stepped torch's SGD without loading torch._dynamo (jobs/lazy_dynamo.py): 1.5 CPU-s a process
    started = {line.split()[0] for line in lines if " exit " not in line}
    ended = {line.split()[0]: line.rsplit("=", 1)[1] for line in lines if " exit " in line}
    assert started == set(ended) and set(ended.values()) == {"False"}, lines


@pytest.mark.slow
def test_a_code_directory_changed_after_the_run_is_never_used(tm_home, tmp_path):
    # not waiting, and no background pass (TRAINMASTER_BACKGROUND_S=0): the run is changed under the broker before
    # it is checked
    out, job = _submit(_job(tmp_path), env={"TRAINMASTER_BACKGROUND_S": "0"})
    assert out.exit_code == 0, out.output
    attempt = paths.attempt_dir(job["id"], 1)
    deadline = time.time() + 240
    while not (attempt / "exit.json").exists():
        assert time.time() < deadline, "the run did not end"
        time.sleep(0.2)
    module = attempt / "code" / "myrecipe.py"
    module.write_text("open(__import__('os').environ['RECIPE_MARKER'], 'a').write('0 TAMPERED\\n')\n" + module.read_text())
    shown = polled(lambda: json.loads(CliRunner().invoke(app, ["status", job["id"], "--json"]).output),
                   lambda now: now["state"] in ("accepted", "failed"), timeout=240)  # the pass a read starts ends it
    assert shown["state"] == "accepted", shown  # audited from a fresh extraction of the bundle the broker sent
    verdict = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())
    assert "replay" in verdict["checks"] and verdict["evidence"]["replay"]["passed"]
    assert not any("TAMPERED" in line for line in _marker_lines(tmp_path))


@pytest.mark.slow
def test_a_state_that_misses_a_hidden_iterator_fails_the_self_check(tm_home, tmp_path):
    out, job = _submit(_job(tmp_path, attr="HIDDEN"), "--wait")
    assert out.exit_code == 1, out.output
    assert job["state"] == "failed"
    reason = job["attempts"][0]["reason"]
    expected = "state() does not capture everything the next steps read: bias, weight, optimizer/state/0/momentum_buffer"
    assert expected in reason, reason
    assert not (paths.attempt_dir(job["id"], 1) / "outputs" / "commitment.json").exists()  # it committed to nothing


@pytest.mark.slow
def test_with_the_self_check_off_the_same_run_commits_and_its_audit_rejects_it(tm_home, tmp_path):
    """`checkpoint.selfcheck: false` reaches the runtime on the user's path: the run ends without its self-check
    (no line of it in the log), commits, and the replay audit is what refuses the state() that misses something."""
    spec = _job(tmp_path, attr="HIDDEN")
    spec.write_text(spec.read_text().replace("  segment_steps: 25\n", "  segment_steps: 25\n  selfcheck: false\n"))
    out, job = _submit(spec, "--wait")
    assert out.exit_code == 1, out.output
    assert job["state"] == "failed" and job["reason"].startswith("rejected: the replay audit failed"), job["reason"]
    assert job["attempts"][0]["state"] == "rejected", job["attempts"]
    assert (paths.attempt_dir(job["id"], 1) / "outputs" / "commitment.json").exists()
    log = (paths.attempt_dir(job["id"], 1) / "job.log").read_text()
    assert "self-check" not in log, log[-2000:]
    verdict = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())
    assert verdict["outcome"] == "rejected" and "optimizer/state/0/momentum_buffer" in json.dumps(verdict), verdict


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["UntrustedExecutor", "LazyOwnRecipeExecutor"])
def test_an_own_recipe_on_untrusted_compute_is_audited_and_a_cheat_rejected(tm_home, tmp_path, monkeypatch, executor):
    from trainmaster.backends import registry

    harness = f"{'untrusted_backend' if executor == 'UntrustedExecutor' else 'test_user_recipe'}:{executor}"
    monkeypatch.setitem(registry.REGISTRY, "bittensor", dataclasses.replace(registry.REGISTRY["bittensor"], target=harness))
    monkeypatch.setitem(registry.BACKENDS, "bittensor", harness)
    (tmp_path / "untrusted.yaml").write_text(POLICY)
    out, job = _submit(_job(tmp_path), "--policy", tmp_path / "untrusted.yaml", "--wait")
    [attempt] = job["attempts"]
    assert attempt["backend"] == "bittensor"
    if executor == "UntrustedExecutor":  # from the seed the broker derived, within τ
        assert out.exit_code == 0 and attempt["state"] == "accepted", out.output
        replay = json.loads((paths.job_dir(job["id"]) / "verdict.json").read_text())["evidence"]["replay"]
        assert replay["tau_source"] == "explicit" and [s["index"] for s in replay["segments"]] == [0, 1, 2, 3]
    else:
        assert out.exit_code == 1 and attempt["state"] == "rejected", out.output
        assert "replay audit failed" in attempt["reason"] and "another config than the spec's" in attempt["reason"]
    assert "myrecipe" not in sys.modules


class LazyOwnRecipeExecutor(UntrustedExecutor):
    """Trains the job's own recipe with 0.9 × the spec's learning rate, as LazyExecutor does tiny-lm, and
    commits honestly to what it computed."""

    def executed(self, spec):
        return spec.model_copy(update={"entrypoint": f"{spec.entrypoint} --lr 0.045"})


@pytest.mark.slow
@pytest.mark.parametrize("audit", ["always", "never"])
def test_a_two_process_runtime_job_is_refused_up_front_when_it_would_be_audited(tm_home, tmp_path, audit):
    spec = _job(tmp_path, extra="resources:\n  processes: 2\n")
    spec.write_text(spec.read_text().replace("replay_audit: always", f"replay_audit: {audit}"))
    out = CliRunner().invoke(app, ["submit", str(spec), "--dry-run"])
    if audit == "never":  # trusted compute, no audit: nothing to replay
        assert out.exit_code == 0, out.output
        return
    assert out.exit_code == 1, out.output
    assert "resources.processes: a runtime recipe run by 2 processes cannot be replay-audited" in " ".join(out.output.split())
    submitted = CliRunner().invoke(app, ["submit", str(spec)])
    assert submitted.exit_code == 1 and "cannot be replay-audited" in " ".join(submitted.output.split())
    listed = CliRunner().invoke(app, ["ls", "--all", "--json"])
    assert json.loads(listed.output) == []  # nothing was recorded


# the pieces, without a run


@pytest.mark.parametrize(
    ("recipe", "match"),
    [
        ("myrecipe", "must be `module:attr`"),
        ("my-recipe:RECIPE", "must be `module:attr`"),
        ("trainmaster.verify.audit:run_audit", "must be a shipped recipe"),
        ("missing:RECIPE", "module missing not found in the code directory"),
    ],
)
def test_the_spec_names_a_recipe_as_module_attr_inside_the_code(tmp_path, recipe, match):
    from trainmaster.jobs.spec import load_spec
    from trainmaster.jobs.yamlfile import FileError

    spec = _job(tmp_path)
    spec.write_text(spec.read_text().replace("myrecipe:RECIPE", recipe))
    with pytest.raises(FileError, match=match) as caught:
        load_spec(spec)
    assert "recipe" in str(caught.value)


def test_an_own_recipe_is_described_from_the_spec_without_importing_it(tmp_path):
    from trainmaster.jobs.spec import load_spec
    from trainmaster.verify.recipe_run import NotReplayable, processes_refusal, recipe_run, user_recipe

    spec = _job(tmp_path)
    spec.write_text(spec.read_text().replace("--lr 0.05", "--lr ${LR}").replace("env:\n", "env:\n  LR: '0.07'\n"))
    loaded = load_spec(spec)
    run = user_recipe(loaded)
    assert (run.target, run.options, run.seed, run.k) == ("myrecipe:RECIPE", ("--steps", "100", "--lr", "0.07"), 2, 25)
    assert "myrecipe" not in sys.modules
    with pytest.raises(NotReplayable, match="audited in a child process"):
        recipe_run(loaded)
    shipped = loaded.spec.model_copy(update={"recipe": "trainmaster.jobs.recipes.dqn:RECIPE",
                                             "entrypoint": "python train.py --steps 50 --learning-starts 10"})
    assert user_recipe(shipped) is None and recipe_run(shipped).config["learning_starts"] == 10
    two = loaded.spec.model_copy(update={"resources": loaded.spec.resources.model_copy(update={"processes": 2})})
    assert "run by 2 processes" in processes_refusal(two)
    with pytest.raises(NotReplayable, match="run by 2 processes"):
        user_recipe(two)


@pytest.mark.slow
def test_a_recipe_that_cannot_be_imported_from_its_verified_bundle_cannot_verify(tmp_path):
    from trainmaster.jobs.bundle import build_bundle, extract_bundle
    from trainmaster.jobs.commitment import Commitment
    from trainmaster.verify.errors import VerificationError
    from trainmaster.verify.recipe_audit import audit_user_recipe
    from trainmaster.verify.recipe_run import UserRecipeRun

    source = tmp_path / "source"
    source.mkdir()
    (source / "broken.py").write_text("WHY = 1 / 0\n")
    bundle = build_bundle(source, b"{}", tmp_path / "bundles")
    extract_bundle(bundle.path, tmp_path / "code", expected_sha256=bundle.sha256)
    commitment = Commitment(bundle_sha256=bundle.sha256, final_sha256="00" * 32, job_id="j", k=25, n=4, root="11" * 32)
    with pytest.raises(VerificationError) as caught:
        audit_user_recipe(UserRecipeRun("broken:RECIPE", (), 0, 25), commitment=commitment, openings_dir=tmp_path,
                          segments=[0], code_dir=tmp_path / "code", tau=0.01)
    assert caught.value.kind == "cannot_verify"
    assert caught.value.reason == (
        "the job's recipe broken:RECIPE cannot be imported from its verified bundle: ZeroDivisionError: division by zero"
    )


@pytest.mark.parametrize(
    ("phase", "code", "kind"),
    [("executor", -9, "rejected"), ("executor", 1, "rejected"), ("import", -9, "cannot_verify"), (None, 1, "cannot_verify")],
)
def test_a_child_that_dies_is_blamed_on_the_executor_only_while_replaying_its_states(tmp_path, phase, code, kind):
    from trainmaster.verify.errors import VerificationError
    from trainmaster.verify.recipe_audit import _outcome

    if phase:
        (tmp_path / "phase").write_text(phase)
    (tmp_path / "log").write_text("Traceback …\nMemoryError\n")
    with pytest.raises(VerificationError) as caught:
        _outcome(tmp_path, code, "myrecipe:RECIPE")
    assert caught.value.kind == kind and caught.value.reason.endswith("MemoryError")


def test_an_unreadable_result_cannot_verify(tmp_path):
    from trainmaster.verify.errors import VerificationError
    from trainmaster.verify.recipe_audit import _outcome

    (tmp_path / "result.json").write_text('{"kind": "report", "report": {"passed": true}}')
    with pytest.raises(VerificationError, match="unreadable result") as caught:
        _outcome(tmp_path, 0, "myrecipe:RECIPE")
    assert caught.value.kind == "cannot_verify"

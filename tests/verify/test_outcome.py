"""The outcome check: evaluator subprocess, thresholds, the no-regression rule, self-reported metrics."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trainmaster.verify.errors import VerificationError
from trainmaster.verify.outcome import check_outcome, parse_metrics_line, regression_failures


def evaluator(code_dir: Path, body: str) -> str:
    """An evaluator script in the bundle; returns its command."""
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "evaluate.py").write_text(textwrap.dedent(body))
    return "python evaluate.py"


ECHO_CHECKPOINT = """
    import json, os, pathlib
    path = pathlib.Path(os.environ["TRAINMASTER_EVAL_CHECKPOINT"])
    print("loading", path)
    print(json.dumps({"accuracy": float(path.read_text()), "checkpoint": str(path), "ok": True}))
"""


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    path = tmp_path / "out" / "model.safetensors"
    path.parent.mkdir()
    path.write_text("0.93")
    return path


def test_evaluator_metrics_pass_thresholds(tmp_path, checkpoint):
    command = evaluator(tmp_path / "code", ECHO_CHECKPOINT)
    result = check_outcome(checkpoint, thresholds={"accuracy": 0.9}, evaluator=command, code_dir=tmp_path / "code")
    assert result.passed and result.source == "evaluator"
    assert result.metrics == {"accuracy": 0.93}  # strings and bools are not metrics
    assert "loading" in result.output


def test_evaluator_metrics_below_threshold_fail(tmp_path, checkpoint):
    command = evaluator(tmp_path / "code", ECHO_CHECKPOINT)
    result = check_outcome(checkpoint, thresholds={"accuracy": 0.95}, evaluator=command, code_dir=tmp_path / "code")
    assert not result.passed
    assert result.failures == ["accuracy = 0.93 is below the threshold 0.95"]


def test_no_regression_rule(tmp_path, checkpoint):
    command = evaluator(tmp_path / "code", ECHO_CHECKPOINT)
    run = lambda previous: check_outcome(  # noqa: E731
        checkpoint, thresholds={"accuracy": 0.5}, evaluator=command, code_dir=tmp_path / "code", previous=previous
    )
    assert run({"accuracy": 1.0}).passed  # 0.93 ≥ 0.90 × 1.0
    failed = run({"accuracy": 1.05})  # 0.93 < 0.945
    assert not failed.passed and "regressed below 90% of the previous accepted 1.05" in failed.failures[0]
    assert run({"other": 100.0}).passed
    assert run(None).passed


def test_regression_floor_for_negative_metrics():
    assert regression_failures({"return": -105.0}, {"return": -1000}, {"return": -100.0}) == []
    assert regression_failures({"return": -111.0}, {"return": -1000}, {"return": -100.0})


def test_function_evaluator_is_preferred(tmp_path, checkpoint):
    seen = []
    result = check_outcome(
        checkpoint, thresholds={"loss_neg": -1.0}, evaluator="false",
        evaluate=lambda path: seen.append(path) or {"loss_neg": -0.5},
    )
    assert result.passed and result.source == "function" and seen == [checkpoint]


@pytest.mark.parametrize(
    "body, match",
    [
        ("import sys; sys.exit(3)", "exited with status 3"),
        ("print('no metrics here')", "did not end its output with a JSON object"),
        ("print('[1, 2]')", "did not end its output with a JSON object"),
        ("print('{\"loss\": 1.0}')", "metric 'accuracy' is not among the reported metrics"),
    ],
)
def test_broken_evaluators_cannot_verify(tmp_path, checkpoint, body, match):
    command = evaluator(tmp_path / "code", body)
    with pytest.raises(VerificationError, match=match) as caught:
        check_outcome(checkpoint, thresholds={"accuracy": 0.9}, evaluator=command, code_dir=tmp_path / "code")
    assert caught.value.kind == "cannot_verify"


def test_missing_evaluator_command_cannot_verify(tmp_path, checkpoint):
    with pytest.raises(VerificationError, match="could not run") as caught:
        check_outcome(checkpoint, thresholds={"a": 1}, evaluator="./no-such-evaluator", code_dir=tmp_path)
    assert caught.value.kind == "cannot_verify"


def test_evaluator_timeout_cannot_verify(tmp_path, checkpoint):
    command = evaluator(tmp_path / "code", "import time; time.sleep(30)")
    with pytest.raises(VerificationError, match="could not run"):
        check_outcome(checkpoint, thresholds={"a": 1}, evaluator=command, code_dir=tmp_path / "code", timeout_s=0.5)


def test_non_finite_metric_fails(tmp_path, checkpoint):
    command = evaluator(tmp_path / "code", "print('{\"accuracy\": NaN}')")
    result = check_outcome(checkpoint, thresholds={"accuracy": 0.0}, evaluator=command, code_dir=tmp_path / "code")
    assert not result.passed


def test_last_nonempty_line_holds_the_metrics():
    assert parse_metrics_line('{"a": 0}\nnoise\n{"a": 1, "b": 2.5}\n\n  \n', "cmd") == {"a": 1.0, "b": 2.5}


def test_reported_metrics_only_from_trusted_executors(checkpoint):
    outputs = checkpoint.parent
    (outputs / "result.json").write_text(json.dumps({"final_mean_return": 480.0, "recipe": "dqn"}))
    result = check_outcome(checkpoint, thresholds={"final_mean_return": 400}, outputs=outputs, trust_reported=True)
    assert result.passed and result.source == "result.json"
    with pytest.raises(VerificationError, match="self-reported") as caught:
        check_outcome(checkpoint, thresholds={"final_mean_return": 400}, outputs=outputs)
    assert caught.value.kind == "cannot_verify"


def test_nothing_to_check_passes(checkpoint):
    result = check_outcome(checkpoint, thresholds={})
    assert result.passed and result.source == "none"

"""Job files: good ones load, bad ones say file, line and field."""

from __future__ import annotations

import json

import pytest

from trainmaster.jobs.money import display_usd, format_usd, parse_usd
from trainmaster.jobs.spec import job_schema, load_spec
from trainmaster.jobs.yamlfile import FileError


def spec_file(tmp_path, body: str, script: str | None = "train.py"):
    if script:
        (tmp_path / script).write_text("print('hi')\n")
    path = tmp_path / "job.yaml"
    path.write_text(body)
    return path


def problems(path) -> list[str]:
    with pytest.raises(FileError) as info:
        load_spec(path)
    return info.value.problems


def test_minimal_spec_gets_defaults(tmp_path):
    loaded = load_spec(spec_file(tmp_path, "name: demo\nentrypoint: python train.py\n"))
    assert loaded.spec.resources.nproc == 1
    assert loaded.spec.checkpoint.segment_steps == 25
    assert loaded.code_dir == tmp_path.resolve()


def test_misspelt_key_gets_line_and_suggestion(tmp_path):
    body = "name: demo\nentrypoint: python train.py\nresources:\n  gpus: 1\n  gpu_type: [A100]\n"
    [problem] = problems(spec_file(tmp_path, body))
    assert problem.startswith(f"{tmp_path / 'job.yaml'}:5: resources.gpu_type: unknown field")
    assert "did you mean 'gpu_types'" in problem


def test_unknown_top_level_key_without_near_match_lists_allowed(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: demo\nentrypoint: python train.py\nzzz: 1\n"))
    assert ":3: zzz: unknown field" in problem and "allowed:" in problem and "entrypoint" in problem


def test_wrong_type_names_line_and_field(tmp_path):
    body = "name: demo\nentrypoint: python train.py\nlimits:\n  max_hours: soon\n"
    [problem] = problems(spec_file(tmp_path, body))
    assert ":4: limits.max_hours:" in problem and "number" in problem


def test_list_item_error_points_at_item(tmp_path):
    body = "name: demo\nentrypoint: python train.py\ndata:\n  - name: a\n    source: x\n  - name: b\n    source: ftp://h/x\n"
    (tmp_path / "x").write_text("")
    found = problems(spec_file(tmp_path, body))
    assert any(":7: data.1.source:" in p and "s3://" in p for p in found), found


def test_missing_required_field(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: demo\n"))
    assert "entrypoint: required field is missing" in problem


def test_yaml_syntax_error_has_position(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: demo\nentrypoint: [python\n"))
    assert "invalid YAML" in problem and f"{tmp_path / 'job.yaml'}:" in problem


def test_duplicate_keys_are_refused(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: a\nentrypoint: python train.py\nname: b\n"))
    assert ":3: name: duplicate key (first on line 1)" in problem


def test_missing_entrypoint_script(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: demo\nentrypoint: python trian.py\n"))
    assert "entrypoint: trian.py not found" in problem


def test_missing_code_dir(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: demo\nentrypoint: python train.py\ncode: nowhere\n"))
    assert "code: directory" in problem and "nowhere" in problem


def test_module_entrypoint_needs_no_file(tmp_path):
    loaded = load_spec(spec_file(tmp_path, "name: demo\nentrypoint: python -m trainmaster.jobs.recipes.dqn\n", None))
    assert loaded.spec.argv[:2] == ["python", "-m"]


def test_reserved_env_names_refused(tmp_path):
    [problem] = problems(spec_file(tmp_path, "name: demo\nentrypoint: python train.py\nenv:\n  TRAINMASTER_SEED: '3'\n"))
    assert "set by trainmaster itself" in problem


def test_money_is_exact_integers(tmp_path):
    loaded = load_spec(spec_file(tmp_path, "name: demo\nentrypoint: python train.py\nlimits:\n  max_usd: 0.1\n  max_usd_per_hour: '$2.35'\n"))
    assert loaded.spec.limits.max_usd == 100_000
    assert loaded.spec.limits.max_usd_per_hour == 2_350_000
    # the canonical form round-trips without drift
    again = json.loads(loaded.spec.canonical_json())
    assert again["limits"]["max_usd"] == "0.1"


def test_money_helpers():
    assert parse_usd("12.50") == 12_500_000
    assert parse_usd(3) == 3_000_000
    with pytest.raises(ValueError):
        parse_usd("0.0000001")
    with pytest.raises(ValueError):
        parse_usd(True)
    assert format_usd(1) == "0.000001" and format_usd(-2_500_000) == "-2.5"
    assert display_usd(12_345_678) == "$12.35" and display_usd(23) == "$0.000023"


def test_schema_is_generated_from_the_models():
    schema = job_schema()
    assert schema["additionalProperties"] is False
    assert "entrypoint" in schema["required"]
    assert schema["$defs"]["Resources"]["additionalProperties"] is False

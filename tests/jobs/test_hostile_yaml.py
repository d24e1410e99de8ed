"""User YAML files cannot hang or crash the CLI: aliases are refused and deep nesting is a file:line error."""

from __future__ import annotations

import pytest
from cli_run import tm

from trainmaster.jobs.spec import JobSpec
from trainmaster.jobs.yamlfile import MAX_DEPTH, FileError, load_model

TRAIN = "print('hi')\n"


def alias_bomb(indent: str = "") -> str:
    """About 1 KB that expands to 9**9 strings when aliases are followed."""
    lines = [f'{indent}a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{indent}{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def deep_flow(depth: int = 50_000) -> str:
    return "[" * depth + "]" * depth + "\n"


def deep_block(depth: int = 50_000) -> str:
    """Block sequences nested on one line (`- - - x`): linear in size, unlike indented mappings."""
    return "- " * depth + "x\n"


def deep_mapping(depth: int = 2_000) -> str:
    return "".join(" " * i + f"k{i}:\n" for i in range(depth)) + " " * depth + "x\n"


@pytest.mark.parametrize("body", [
    "unknown:\n" + alias_bomb("  "),
    "env:\n  A: &x hello\n  B: *x\n",
    "resources: " + deep_flow(),
    "extra:\n  " + deep_block(),
    "extra:\n" + "".join(" " + line for line in deep_mapping(1_000).splitlines(keepends=True)),  # under 1 MiB
])
def test_submit_dry_run_refuses_hostile_yaml_with_file_line(job_factory, tmp_path, body):
    spec = job_factory(TRAIN, body)
    out = tm("submit", str(spec), "--dry-run", home=tmp_path / "home")
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and f"{spec}:" in out.stderr
    assert "alias" in out.stderr or f"deeper than {MAX_DEPTH}" in out.stderr


@pytest.mark.parametrize("text", [alias_bomb(), deep_flow(), deep_block(), deep_mapping()])
def test_policy_check_refuses_hostile_yaml(tmp_path, text):
    policy = tmp_path / "p.yaml"
    policy.write_text(text)
    out = tm("policy", "check", str(policy), home=tmp_path / "home")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and f"{policy}:" in out.stderr + out.stdout


def test_a_deep_but_allowed_file_still_parses_and_the_limit_names_the_line():
    ok = "name: t\nentrypoint: python x.py\nenv: {A: '1'}\n"
    assert load_model("x.yaml", JobSpec, text=ok).env == {"A": "1"}
    with pytest.raises(FileError) as caught:
        load_model("x.yaml", JobSpec, text="name: t\nentrypoint: e\nenv:\n  " + deep_flow(MAX_DEPTH + 1))
    assert caught.value.problems[0].startswith("x.yaml:4:") and "nested deeper" in caught.value.problems[0]


def test_an_anchor_alone_is_harmless_and_accepted():
    spec = load_model("x.yaml", JobSpec, text="name: &n t\nentrypoint: python x.py\n")
    assert spec.name == "t"


@pytest.mark.parametrize("text", [alias_bomb(), deep_flow()])
def test_backends_check_refuses_a_hostile_backends_yaml(tmp_path, text):
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "backends.yaml").write_text(text)
    out = tm("backends", "check", home=home)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "backends.yaml:" in out.stderr

"""`trainmaster backends check | show` through the real app: backends.yaml errors, readiness reasons,
credentials found from the environment, and no SDK imported to find out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from trainmaster.backends.registry import REGISTRY
from trainmaster.broker.cli import app

CREDENTIAL_VARS = ("AWS_", "GOOGLE_", "CLOUDSDK_", "AZURE_")


@pytest.fixture
def env(tm_home, tmp_path, monkeypatch) -> dict[str, str]:
    """No cloud credentials from the machine running the tests: an empty HOME, no credential variables."""
    for name in list(os.environ):
        if name.startswith(CREDENTIAL_VARS):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return {"COLUMNS": "200"}


def tm(env: dict, *args: str):
    return CliRunner().invoke(app, list(args), env=env)


def checked(env: dict) -> dict[str, dict]:
    result = tm(env, "backends", "check", "--json")
    assert result.exit_code == 0, result.output
    return {row["backend"]: row for row in json.loads(result.stdout)}


def write_config(tm_home, text: str):
    path = tm_home / "config" / "backends.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_check_lists_every_registered_backend_with_its_reasons(env):
    rows = checked(env)
    assert list(rows) == ["local", "bittensor", "aws", "gcp", "azure"] == list(REGISTRY)
    assert rows["local"]["ready"] and rows["local"]["reasons"] == []
    assert any("CPUs" in note for note in rows["local"]["found"])
    for cloud in ("aws", "gcp", "azure"):
        row = rows[cloud]
        assert not row["ready"] and not row["implemented"]
        assert any(r.startswith("no credentials found") for r in row["reasons"]), row
        assert row["reasons"][-1] == "dispatch not available in this version (catalog prices only)"
    assert rows["bittensor"]["reasons"][-1] == "dispatch not available in this version"
    assert any("no hotkey file" in r for r in rows["bittensor"]["reasons"])


def test_a_missing_extra_is_named_with_its_pip_command(env, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "boto3" else real(name, *a))
    assert "extra not installed (pip install 'trainmaster[aws]')" in checked(env)["aws"]["reasons"]


def test_human_table_says_why(env):
    result = tm(env, "backends", "check")
    assert result.exit_code == 0
    line = next(line for line in result.stdout.splitlines() if line.strip().startswith("aws"))
    assert " no " in line and "extra not installed" in result.stdout


def test_fake_aws_env_credentials_remove_the_credential_reason(env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake")
    aws = checked(env)["aws"]
    assert not any("credentials" in r for r in aws["reasons"]), aws
    assert aws["found"] == ["credentials: environment (AWS_ACCESS_KEY_ID)"]


def test_aws_profile_must_exist_in_the_shared_files(env, tm_home, tmp_path):
    write_config(tm_home, "aws:\n  profile: training\n")
    assert any("profile 'training' not found" in r for r in checked(env)["aws"]["reasons"])
    aws_dir = tmp_path / "user" / ".aws"
    aws_dir.mkdir(parents=True)
    (aws_dir / "config").write_text("[profile training]\nregion = us-east-1\n")
    aws = checked(env)["aws"]
    assert not any("profile" in r or "credentials" in r for r in aws["reasons"])
    assert aws["found"] == [f"credentials: profile 'training' in {aws_dir / 'config'}"]


def test_gcp_and_azure_credentials(env, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    assert any("which does not exist" in r for r in checked(env)["gcp"]["reasons"])
    (tmp_path / "key.json").write_text("{}")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    monkeypatch.setenv("AZURE_CLIENT_ID", "id")
    monkeypatch.setenv("AZURE_TENANT_ID", "tenant")
    rows = checked(env)
    for cloud in ("gcp", "azure"):
        assert not any("credentials" in r for r in rows[cloud]["reasons"]), rows[cloud]


def test_bittensor_hotkey_file_from_the_configured_wallet(env, tm_home, tmp_path):
    wallets = tmp_path / "wallets"
    write_config(tm_home, f"bittensor:\n  netuid: 12\n  wallet:\n    name: trainer\n    path: {wallets}\n    hotkey: h1\n")
    assert any(str(wallets / "trainer" / "hotkeys" / "h1") in r for r in checked(env)["bittensor"]["reasons"])
    (wallets / "trainer" / "hotkeys").mkdir(parents=True)
    (wallets / "trainer" / "hotkeys" / "h1").write_text("{}")
    row = checked(env)["bittensor"]
    assert row["reasons"][-1:] == ["dispatch not available in this version"]
    assert not any("hotkey" in r for r in row["reasons"]) and "network: finney, subnet 12" in row["found"]


def test_a_typo_in_backends_yaml_names_file_line_and_field(env, tm_home):
    path = write_config(tm_home, "aws:\n  region: us-east-1\n  profle: dev\ngcp:\n  staging_bucket: my-bucket\n")
    for command in ("check", "show"):
        result = tm(env, "backends", command)
        assert result.exit_code == 1, result.output
        assert f"{path}:3: aws.profle: unknown field; did you mean 'profile'?" in result.stderr
        assert f"{path}:5: gcp.staging_bucket:" in result.stderr
    write_config(tm_home, "aws: {}\nazur:\n  workspace: w\n")
    assert "azur: unknown field; did you mean 'azure'?" in tm(env, "backends", "check").stderr


def test_show_lays_the_file_over_the_defaults(env, tm_home):
    path = write_config(tm_home, "# settings\nlocal:\n  power: {gpu_watts: 450}\ngcp:\nazure:\n  workspace: ml\n")
    result = tm(env, "backends", "show", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["file"] == str(path) and shown["exists"]
    assert shown["backends"]["local"]["power"]["gpu_watts"] == 450
    assert shown["backends"]["local"]["power"]["host_watts"] == 120  # default kept
    assert shown["backends"]["gcp"]["location"] == "us-central1"  # empty section: defaults
    assert shown["backends"]["azure"]["workspace"] == "ml"
    write_config(tm_home, "# everything commented out\n")
    assert tm(env, "backends", "show", "--json").exit_code == 0
    assert "workspace: ml" not in tm(env, "backends", "show").stdout


def test_show_prints_the_power_model_used_and_where_each_value_came_from(env, tm_home, tmp_path):
    """A user's local.power in backends.yaml is what a shipped policy prices with (no policy overrides it
    silently), and a policy that does set `power` wins, and says so."""
    write_config(tm_home, "local:\n  power: {gpu_watts: 450}\n")
    for policy in ("default", "hybrid", "privacy-first"):
        shown = json.loads(tm(env, "backends", "show", "--json", "--policy", policy).stdout)
        assert shown["backends"]["local"]["power"]["gpu_watts"] == 450
        assert shown["sources"]["local"]["power"] == "backends.yaml"
        assert shown["sources"]["local"]["cpus"] == "default"
        assert shown["sources"]["local"]["envs_dir"] == "broker default"
    own = tmp_path / "own.yaml"
    own.write_text("name: own\npower: {gpu_watts: 200}\n")
    shown = json.loads(tm(env, "backends", "show", "--json", "--policy", str(own)).stdout)
    assert shown["backends"]["local"]["power"]["gpu_watts"] == 200
    assert shown["sources"]["local"]["power"] == "policy own"
    text = tm(env, "backends", "show", "--policy", str(own)).stdout
    assert "power:  # policy own" in text and "gpu_watts: 200" in text and "cpus: null  # default" in text


def test_the_power_model_shown_is_the_one_a_shipped_policy_prices_with(env, tm_home, tmp_path):
    write_config(tm_home, "local:\n  power: {host_watts: 1000}\n")
    (tmp_path / "train.py").write_text("print('x')\n")
    (tmp_path / "job.yaml").write_text("name: p\nentrypoint: python train.py\n")
    offered = json.loads(tm(env, "offers", str(tmp_path / "job.yaml"), "--json").stdout)
    assert offered["considered"][0]["offer"]["price_per_hour_micro_usd"] == (1000 * 150_000 + 999) // 1000


def test_check_imports_no_sdk(env, tm_home):
    code = (
        "import sys\n"
        "from trainmaster.broker.cli import app\n"
        "try:\n    app(['backends', 'check', '--json'])\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "sdks = ('boto3', 'botocore', 'google.cloud.aiplatform', 'google.cloud.storage', 'azure.ai.ml',"
        " 'azure.identity', 'bittensor')\n"
        "print('SDKS', [m for m in sdks if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "SDKS []" in out.stdout
    assert json.loads(out.stdout.split("SDKS")[0])[0]["backend"] == "local"

"""`trainmaster backends check | show` through the real app: backends.yaml errors, readiness reasons,
credentials found from the environment, and no SDK imported to find out."""

from __future__ import annotations

import importlib.util
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


def findable(module: str) -> bool:
    """Whether `module` is installed here: the expectation for the "extra not installed" reason."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def write_config(tm_home, text: str):
    path = tm_home / "config" / "backends.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_check_lists_every_registered_backend_with_its_reasons(env):
    rows = checked(env)
    assert list(rows) == ["local", "bittensor", "aws", "gcp", "azure", "ray"] == list(REGISTRY)
    assert rows["local"]["ready"] and rows["local"]["reasons"] == []
    assert any("CPUs" in note for note in rows["local"]["found"])
    for cloud in ("aws", "gcp", "azure"):
        row, entry = rows[cloud], REGISTRY[cloud]
        assert not row["ready"] and row["implemented"] == entry.implemented
        assert any(r.startswith("no credentials found") for r in row["reasons"]), row
        planned = "dispatch not available in this version (catalog prices only)"
        assert (row["reasons"][-1] == planned) == (not entry.implemented), row
        assert (planned in row["reasons"]) == (not entry.implemented), row
        missing = f"extra not installed (pip install 'trainmaster[{cloud}]')"
        assert (missing in row["reasons"]) == (not all(findable(m) for m in entry.sdk)), row
    assert rows["bittensor"]["implemented"] and "dispatch not available in this version" not in rows["bittensor"]["reasons"]
    assert any("no hotkey file" in r for r in rows["bittensor"]["reasons"])
    assert any(r.startswith("no miners: list them under bittensor.miners") for r in rows["bittensor"]["reasons"])
    assert rows["ray"]["implemented"] and not rows["ray"]["ready"]  # checked off the network: no cluster is asked
    assert any(r.startswith("ray.storage_path is not set") for r in rows["ray"]["reasons"]), rows["ray"]


def test_a_missing_extra_is_named_with_its_pip_command(env, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "boto3" else real(name, *a))
    assert "extra not installed (pip install 'trainmaster[aws]')" in checked(env)["aws"]["reasons"]


def test_an_installed_extra_is_no_reason(env, monkeypatch):
    real = importlib.util.find_spec  # whichever extras are installed here, all are found for this test
    sdks = {module for entry in REGISTRY.values() for module in entry.sdk}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in sdks else real(name, *a))
    assert not any(r.startswith("extra not installed") for row in checked(env).values() for r in row["reasons"])


def test_human_table_says_why(env, monkeypatch):
    real = importlib.util.find_spec  # whichever extras are installed here, one is missing for this test
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "boto3" else real(name, *a))
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


AWS_CONFIG = """\
[profile empty]
region = us-east-1

[profile sso]
sso_start_url = https://example.awsapps.com/start
sso_region = us-east-1
sso_account_id = 123456789012
sso_role_name = Trainer

[profile proc]
credential_process = {python} -c "print('{{\\"Version\\": 1, \\"AccessKeyId\\": \\"AKIAPROC\\", \\"SecretAccessKey\\": \\"s\\"}}')"
"""


@pytest.mark.parametrize(
    ("profile", "reason", "found"),
    [
        ("missing", "profile 'missing' not found in {credentials} or {config}", None),
        ("empty", "no credentials found for profile 'empty' in {credentials} or {config} or the environment", None),
        ("sso", None, "credentials: SSO, profile 'sso'"),
        ("proc", None, "credentials: credential_process, profile 'proc'"),
        ("keys", None, "credentials: keys in the shared credentials file, profile 'keys'"),
    ],
)
def test_aws_credentials_are_what_botocore_finds_without_the_network(env, tm_home, tmp_path, monkeypatch, profile,
                                                                     reason, found):
    files = {"config": tmp_path / "aws-config", "credentials": tmp_path / "aws-credentials"}
    files["config"].write_text(AWS_CONFIG.format(python=sys.executable))
    files["credentials"].write_text("[keys]\naws_access_key_id = AKIAFAKE\naws_secret_access_key = fake\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(files["config"]))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(files["credentials"]))
    write_config(tm_home, f"aws:\n  profile: {profile}\n")
    aws = checked(env)["aws"]
    credential_reasons = [r for r in aws["reasons"] if "profile" in r or "credentials" in r]
    if reason is None:
        assert credential_reasons == [], aws
    else:
        assert len(credential_reasons) == 1 and credential_reasons[0].startswith(reason.format(**files)), aws
    assert aws["found"] == ([found] if found else [])


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
    assert "dispatch not available in this version" not in row["reasons"]
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
        # botocore's credential resolver is asked (backends/aws/check.py); no client SDK is imported
        "sdks = ('boto3', 'google.cloud.aiplatform', 'google.cloud.storage', 'azure.ai.ml',"
        " 'azure.identity', 'bittensor')\n"
        "print('SDKS', [m for m in sdks if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "SDKS []" in out.stdout
    assert json.loads(out.stdout.split("SDKS")[0])[0]["backend"] == "local"


ALICE = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"  # a well-known dev key, Bittensor's format 42


@pytest.mark.parametrize(
    ("miner", "why"),
    [
        (ALICE[:-1] + "Z", "is not a valid ss58 address (Invalid checksum); check it for a typo"),  # one character off
        (ALICE[:10] + ALICE[10].swapcase() + ALICE[11:], "is not a valid ss58 address (Invalid checksum)"),
        ("15oF4uVJwmo4TdGW7VfQxNLavjCXviqxT9S1MgbjMNHr6Sp5", "is an ss58 address of another network, not Bittensor's"),
        ("5Grwva", "is not an ss58 hotkey (5F…, 48 characters)"),
    ],
)
def test_a_miner_address_is_checked_with_its_checksum_naming_file_line_and_field(env, tm_home, miner, why):
    path = write_config(tm_home, f"bittensor:\n  netuid: 12\n  miners:\n    - hotkey: {ALICE}\n"
                                 f"      url: http://127.0.0.1:8091\n    - hotkey: {miner}\n      url: http://127.0.0.1:8092\n")
    for command in ("check", "show"):
        result = tm(env, "backends", command)
        assert result.exit_code == 1, result.output
        assert f"{path}:6: bittensor.miners.1.hotkey: " in result.stderr and why in " ".join(result.stderr.split())


def test_a_valid_miner_address_passes(env, tm_home):
    write_config(tm_home, f"bittensor:\n  miners:\n    - hotkey: {ALICE}\n      url: http://127.0.0.1:8091\n")
    assert "1 miners listed" in checked(env)["bittensor"]["found"]


def test_credentials_only_the_network_gives_are_not_checked_offline(env, tm_home, monkeypatch):
    """A managed identity, an ECS task role, a GCE metadata server: `backends check` cannot see them without the
    network, so it says "not checked offline", not "no credentials", and the cloud counts as ready."""
    write_config(tm_home, "azure:\n  subscription_id: s\n  resource_group: rg\n  workspace: ws\n  storage_account: a\n"
                          "  datastore: d\n  credential: managed_identity\n"
                          "aws:\n  region: us-east-1\n  s3_bucket: b\n"
                          "  sagemaker_role_arn: arn:aws:iam::123456789012:role/r\n"
                          "gcp:\n  project: p\n  staging_bucket: gs://b\n")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "/v2/credentials/task")  # what ECS sets
    monkeypatch.setenv("GCE_METADATA_HOST", "169.254.169.254")  # what google-auth reads for the metadata server
    rows = checked(env)
    for cloud in ("aws", "gcp", "azure"):
        if not findable(REGISTRY[cloud].sdk[0]):
            continue
        assert rows[cloud]["ready"], rows[cloud]
        assert rows[cloud]["found"][0].startswith("credentials: not checked offline ("), rows[cloud]
        assert not any("no credentials" in r for r in rows[cloud]["reasons"])

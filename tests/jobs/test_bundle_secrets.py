"""Key and credential files stay out of a bundle unless `.trainmasterignore` brings one back, and the
CLI says what it left out."""

from __future__ import annotations

import json
import tarfile

import pytest
from cli_run import tm

from trainmaster.jobs.bundle import build_bundle, bundle_digest, collect
from trainmaster.jobs.ignore import IgnoreRules

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"
SECRETS = [".env", ".env.local", ".netrc", ".pypirc", "server.pem", "keys/id_rsa", "keys/id_ed25519.pub",
           ".ssh/config", ".aws/credentials", ".gnupg/pubring.kbx", "sub/.env"]


def plant(code):
    for rel in SECRETS:
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text("token=hunter2\n")


def test_secret_files_are_left_out_and_listed(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    (code / "environment.py").write_text("x = 1\n")  # a name like a secret's is not one
    plant(code)
    assert {e.path for e in collect(code)} == {"train.py", "environment.py", "keys", "sub"}
    info = bundle_digest(code, b"{}")
    assert info.left_out == (".aws/", ".env", ".env.local", ".gnupg/", ".netrc", ".pypirc", ".ssh/", "keys/id_ed25519.pub",
                             "keys/id_rsa", "server.pem", "sub/.env")


def test_a_negation_brings_one_back(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    plant(code)
    (code / ".trainmasterignore").write_text("!.env\n!.ssh/\n")
    built = build_bundle(code, b"{}", tmp_path / "out")
    names = tarfile.open(built.path).getnames()
    assert ".env" in names and ".ssh/config" in names and "sub/.env" in names  # `!.env` matches at any depth
    assert ".netrc" not in names and ".netrc" in built.left_out and ".env" not in built.left_out


def test_rules_keep_user_patterns_after_the_defaults():
    rules = IgnoreRules.with_secret_defaults("*.log\n!app.pem\n")
    assert rules.ignored("x.pem", is_dir=False) and rules.left_out_as_secret("x.pem", is_dir=False)
    assert not rules.ignored("app.pem", is_dir=False) and not rules.left_out_as_secret("app.pem", is_dir=False)
    assert rules.ignored("a.log", is_dir=False) and not rules.left_out_as_secret("a.log", is_dir=False)


@pytest.mark.parametrize("dry_run", [True, False])
def test_submit_warns_about_what_it_left_out(job_factory, tmp_path, dry_run):
    spec = job_factory(TRAIN)
    plant(spec.parent)
    home = tmp_path / "home"
    out = tm("submit", str(spec), *(["--dry-run"] if dry_run else ["--wait"]), home=home)
    assert out.returncode == 0, out.stdout + out.stderr
    shown = out.stdout + out.stderr
    assert "left out of the bundle as likely secrets: .aws/, .env" in shown and "!name" in shown
    if not dry_run:
        job_id = json.loads(tm("ls", "--all", "--json", home=home).stdout)[0]["id"]
        code = home / "jobs" / job_id / "attempts" / "1" / "code"
        assert (code / "train.py").is_file() and not (code / ".env").exists() and not (code / ".ssh").exists()
    plan = json.loads(tm("submit", str(spec), "--dry-run", "--json", home=home).stdout)
    assert any("likely secrets" in w for w in plan["warnings"])

"""`trainmaster wallet create | import | show | balance` through the real CLI (a subprocess on its own home and
wallet folder, logging at debug), over bittensor 11's real wallet code: the addresses it shows are the SDK's,
an imported mnemonic gives the same coldkey, and no secret is ever in stdout, stderr, --json or a log file.
The chain is not reachable here: `balance` is checked against a closed port on 127.0.0.1 (a clear error) and,
in process, against the SDK-boundary fake of tests/fake_chain.py."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from cli_run import tm
from fake_chain import FakeSubstrate

DEBUG = {"TRAINMASTER_LOG_LEVEL": "debug"}


def _secrets(keyfile: Path) -> list[str]:
    """The secrets a plaintext keyfile holds: the mnemonic, its words run together, the seed and the private key."""
    data = json.loads(keyfile.read_text())
    secrets = [data["secretPhrase"], data["privateKey"], data["secretSeed"]]
    return [*secrets, *(s.removeprefix("0x") for s in secrets if s.startswith("0x"))]


def _assert_nothing_leaked(texts: list[str], secrets: list[str], home: Path) -> None:
    logs = [p.read_text(errors="replace") for p in home.rglob("*") if p.is_file() and p.suffix in (".log", ".txt", ".json", ".jsonl")]
    for secret in secrets:
        for text in [*texts, *logs]:
            assert secret not in text


def _secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def test_create_show_import_with_no_secret_anywhere(tmp_path, tm_home):
    from bittensor.wallet import Wallet

    wallets = tmp_path / "wallets"
    made = tm("wallet", "create", "--name", "broker", "--path", str(wallets), "--no-password", "--json",
              home=tm_home, extra_env=DEBUG)
    assert made.returncode == 0, made.stderr
    assert "unencrypted" in made.stderr and "tests only" in made.stderr
    created = json.loads(made.stdout)
    sdk = Wallet("broker", "default", path=str(wallets))
    assert created["coldkey_ss58"] == sdk.coldkeypub.ss58_address and created["hotkey_ss58"] == sdk.hotkey.ss58_address
    assert created["coldkey_encrypted"] is False
    secrets = _secrets(wallets / "broker" / "coldkey") + _secrets(wallets / "broker" / "hotkeys" / "default")

    shown = tm("wallet", "show", "--name", "broker", "--path", str(wallets), "--json", home=tm_home, extra_env=DEBUG)
    plain = tm("wallet", "show", "--name", "broker", "--path", str(wallets), home=tm_home, extra_env=DEBUG)
    assert shown.returncode == plain.returncode == 0
    assert json.loads(shown.stdout) == created and sdk.hotkey.ss58_address in plain.stdout

    mnemonic = _secret_file(tmp_path / "words", json.loads((wallets / "broker" / "coldkey").read_text())["secretPhrase"])
    imported = tm("wallet", "import", "--name", "copy", "--path", str(wallets), "--mnemonic-file", str(mnemonic),
                  "--no-password", "--json", home=tm_home, extra_env=DEBUG)
    assert imported.returncode == 0, imported.stderr
    assert json.loads(imported.stdout)["coldkey_ss58"] == created["coldkey_ss58"]
    assert Wallet("copy", "default", path=str(wallets)).coldkeypub.ss58_address == created["coldkey_ss58"]

    again = tm("wallet", "create", "--name", "broker", "--path", str(wallets), "--no-password", home=tm_home)
    assert again.returncode == 2 and "exists" in again.stderr
    assert json.loads(tm("wallet", "show", "--name", "broker", "--path", str(wallets), "--json", home=tm_home).stdout) == created

    outputs = [r.stdout + r.stderr for r in (made, shown, plain, imported, again)]
    _assert_nothing_leaked(outputs, secrets, tm_home)


def test_the_mnemonic_is_shown_once_and_only_on_a_terminal(tmp_path, tm_home):
    wallets = tmp_path / "wallets"
    leader, follower = pty.openpty()
    env = {**os.environ, "TRAINMASTER_HOME": str(tm_home), **DEBUG}
    process = subprocess.Popen([sys.executable, "-m", "trainmaster.broker.cli", "wallet", "create", "--name", "t",
                                "--path", str(wallets), "--no-password"], stdout=follower, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    stderr = process.communicate(timeout=120)[1].decode()
    os.close(leader)
    assert process.returncode == 0, stderr
    terminal = " ".join(b"".join(chunks).decode().split())
    phrase = json.loads((wallets / "t" / "coldkey").read_text())["secretPhrase"]
    assert terminal.count(phrase) == 1 and phrase not in stderr


def test_an_import_from_a_file_others_can_read_is_refused(tmp_path, tm_home):
    words = tmp_path / "words"
    words.write_text("abandon " * 11 + "about\n")
    words.chmod(0o644)
    refused = tm("wallet", "import", "--name", "x", "--path", str(tmp_path / "w"), "--mnemonic-file", str(words),
                 "--no-password", home=tm_home)
    assert refused.returncode == 2 and "readable by others" in refused.stderr
    assert not (tmp_path / "w" / "x").exists() and "abandon" not in refused.stdout + refused.stderr


def test_balance_of_an_unreachable_chain_is_a_clear_error(tmp_path, tm_home):
    wallets = tmp_path / "wallets"
    assert tm("wallet", "create", "--name", "b", "--path", str(wallets), "--no-password", home=tm_home).returncode == 0
    closed = tm("wallet", "balance", "--name", "b", "--path", str(wallets), "--network", "ws://127.0.0.1:9",
                home=tm_home, extra_env=DEBUG)
    assert closed.returncode == 2
    assert "error: the ws://127.0.0.1:9 chain is unreachable" in closed.stderr and "Traceback" not in closed.stderr


def test_balance_reads_integer_rao_from_the_chain(tmp_path, tm_home, monkeypatch):
    """In process (the chain is the SDK-boundary fake): the free balance in rao in --json, nine decimals of TAO else."""
    from typer.testing import CliRunner

    from trainmaster.broker.cli.commands import app
    from trainmaster.wallet import chain, tao_wallet

    info, _ = tao_wallet.create("b", str(tmp_path / "w"), "default", password=None)
    fake = FakeSubstrate(free={info.coldkey_ss58: 12_000_000_001})

    async def opened(network):
        return chain.Chain(fake, network)

    monkeypatch.setattr(chain.Chain, "open", staticmethod(opened))
    runner = CliRunner()
    as_json = runner.invoke(app, ["wallet", "balance", "--name", "b", "--path", str(tmp_path / "w"), "--network", "test",
                                  "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == {"wallet": "b", "coldkey_ss58": info.coldkey_ss58, "network": "test",
                                          "free_rao": 12_000_000_001}
    shown = runner.invoke(app, ["wallet", "balance", "--name", "b", "--path", str(tmp_path / "w"), "--network", "test"])
    assert "12.000000001 TAO" in shown.stdout


@pytest.mark.slow
def test_an_encrypted_coldkey_is_unlocked_only_with_its_password(tmp_path, tm_home, monkeypatch):
    """Encrypting and decrypting cost seconds each (argon2i at 512 MiB): one wallet, made through the CLI."""
    from trainmaster.wallet import tao_wallet

    wallets, password = tmp_path / "wallets", "correct horse battery staple"
    made = tm("wallet", "create", "--name", "enc", "--path", str(wallets), "--password-file",
              str(_secret_file(tmp_path / "pw", password)), "--json", home=tm_home, extra_env=DEBUG)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["coldkey_encrypted"] is True and password not in made.stdout + made.stderr
    monkeypatch.setenv("BT_PW__" + str(wallets).upper(), password)  # the SDK's env lookup is never used
    with pytest.raises(tao_wallet.WalletError, match="no password file is set"):
        tao_wallet.coldkey_password("enc", str(wallets), password_file=None, prompt=False)
    with pytest.raises(tao_wallet.WalletError, match="cannot unlock") as refused:
        tao_wallet.unlock_coldkey("enc", str(wallets), password="wrong")
    assert "wrong" not in str(refused.value)
    found = tao_wallet.coldkey_password("enc", str(wallets), password_file=str(tmp_path / "pw"), prompt=False)
    assert tao_wallet.unlock_coldkey("enc", str(wallets), password=found).ss58_address == json.loads(made.stdout)["coldkey_ss58"]

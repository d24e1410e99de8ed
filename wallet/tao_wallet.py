"""The broker's Bittensor wallet on disk, over the wallet code bittensor 11 ships (`bittensor.wallet.Wallet`).

A wallet is a folder `<path>/<name>/` with an sr25519 coldkey (encrypted with a password unless made
for tests), its public half (`coldkeypub.txt`) and a hotkey (plaintext, as the SDK writes it). Nothing
here prints or logs a secret: the mnemonic of a new wallet is handed back to the caller once, a
password or mnemonic is read from a file (never from the command line, which other users can read,
nor silently from the environment, which the SDK would otherwise consult).
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = "~/.bittensor/wallets"


class WalletError(RuntimeError):
    """The wallet cannot be made, read or unlocked; the message says why and names no secret."""


@dataclass(frozen=True)
class WalletInfo:
    """What may be shown of a wallet: addresses and where its files are, never a key."""

    name: str
    path: str
    hotkey: str
    coldkey_ss58: str
    hotkey_ss58: str | None
    coldkey_file: str
    hotkey_file: str
    coldkey_encrypted: bool


def _wallet(name: str, path: str, hotkey: str):
    from bittensor.wallet import Wallet

    if not name or "/" in name or not hotkey or "/" in hotkey:
        raise WalletError(f"a wallet name and a hotkey name have no '/' and are not empty ({name!r}, {hotkey!r})")
    return Wallet(name, hotkey, path=str(Path(path).expanduser()))


def create(name: str, path: str, hotkey: str, *, password: str | None) -> tuple[WalletInfo, str]:
    """Make a new wallet (coldkey encrypted with `password`; None: plaintext, for tests only) and a hotkey.
    Returns what may be shown and the coldkey's mnemonic, for the caller to show once."""
    wallet = _wallet(name, path, hotkey)
    if wallet.coldkeypub_file.exists_on_device():
        raise WalletError(f"a wallet named {name!r} exists in {path} already; nothing was changed")
    captured: list[str] = []
    wallet.create_new_coldkey(use_password=password is not None, coldkey_password=password, suppress=True,
                              on_mnemonic=captured.append)
    if not wallet.hotkey_file.exists_on_device():
        wallet.create_new_hotkey(use_password=False, suppress=True, on_mnemonic=lambda _: None)
    return show(name, path, hotkey), captured[0]


def import_key(name: str, path: str, hotkey: str, *, password: str | None, mnemonic: str | None = None,
               seed: str | None = None) -> WalletInfo:
    """Make a wallet whose coldkey is restored from a mnemonic or a hex seed, and a new hotkey if it has none."""
    if (mnemonic is None) == (seed is None):
        raise WalletError("give exactly one of a mnemonic or a seed")
    wallet = _wallet(name, path, hotkey)
    if wallet.coldkeypub_file.exists_on_device():
        raise WalletError(f"a wallet named {name!r} exists in {path} already; nothing was changed")
    try:
        wallet.regenerate_coldkey(mnemonic=mnemonic, seed=seed, use_password=password is not None,
                                  coldkey_password=password, suppress=True)
    except (ValueError, TypeError) as exc:
        what = "mnemonic" if mnemonic is not None else "seed"
        raise WalletError(f"not a valid {what} ({type(exc).__name__})") from None
    if not wallet.hotkey_file.exists_on_device():
        wallet.create_new_hotkey(use_password=False, suppress=True, on_mnemonic=lambda _: None)
    return show(name, path, hotkey)


def show(name: str, path: str, hotkey: str) -> WalletInfo:
    """The wallet's addresses (from its public files: no password is asked) and files."""
    wallet = _wallet(name, path, hotkey)
    if not wallet.coldkeypub_file.exists_on_device():
        raise WalletError(f"no wallet named {name!r} in {path} (`trainmaster wallet create --name {name}`)")
    hotkey_ss58 = wallet.hotkeypub.ss58_address if wallet.hotkeypub_file.exists_on_device() else None
    return WalletInfo(name=name, path=str(Path(path).expanduser()), hotkey=hotkey,
                      coldkey_ss58=wallet.coldkeypub.ss58_address, hotkey_ss58=hotkey_ss58,
                      coldkey_file=str(wallet.coldkey_file.path), hotkey_file=str(wallet.hotkey_file.path),
                      coldkey_encrypted=wallet.coldkey_file.is_encrypted())


def unlock_coldkey(name: str, path: str, *, password: str | None):
    """The coldkey's keypair, for signing a transfer. An encrypted coldkey needs `password` (the SDK is never
    left to find one in the environment or to prompt); a wrong one is an error that names no secret."""
    wallet = _wallet(name, path, "default")
    if wallet.coldkey_file.is_encrypted() and not password:
        raise WalletError(f"the coldkey of wallet {name!r} is encrypted: give its password (a file or the prompt)")
    try:
        return wallet.get_coldkey(password=password)
    except Exception as exc:  # noqa: BLE001 — the SDK's keyfile errors carry no secret, but say only their kind
        raise WalletError(f"cannot unlock the coldkey of wallet {name!r} ({type(exc).__name__})") from None


def read_secret_file(path: str | Path) -> str:
    """A password, mnemonic or seed from a file only its owner can read (its one line, stripped)."""
    file = Path(path).expanduser()
    try:
        mode = file.stat().st_mode
        text = file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise WalletError(f"cannot read {file}: {exc.strerror or exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise WalletError(f"{file} is readable by others (mode {stat.S_IMODE(mode):o}); make it 0600")
    if not text:
        raise WalletError(f"{file} is empty")
    return text


def coldkey_password(name: str, path: str, *, password_file: str | None, prompt: bool) -> str | None:
    """The password that unlocks the wallet's coldkey: None when it is not encrypted; else read from
    `password_file`, or asked at the terminal when `prompt` (never taken from the environment)."""
    if not show(name, path, "default").coldkey_encrypted:
        return None
    if password_file:
        return read_secret_file(password_file)
    if not prompt:
        raise WalletError(f"the coldkey of wallet {name!r} is encrypted and no password file is set "
                          "(bittensor.coldkey_password_file in backends.yaml, or --password-file)")
    import getpass

    return getpass.getpass(f"password of the coldkey of wallet {name!r}: ")

"""`trainmaster wallet create | import | show | balance`: the Bittensor wallet that pays miners and signs requests.

Over bittensor 11's wallet code (wallet/tao_wallet.py). Secrets never reach the command line, the
logs or --json: a password, mnemonic or seed is read from a file only its owner can read (or, for a
password, asked at the terminal); a new wallet's mnemonic is shown once, and only to a terminal.
Where no --name/--path/--hotkey is given, backends.yaml's `bittensor.wallet` names the wallet.
Module-level imports stay typer-only so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import json
import sys

import typer

from trainmaster.broker.cli.exits import USAGE, console, escape, fail, guarded

JSON_OPT = typer.Option(False, "--json", help="Machine-readable output (never holds a secret).")
NAME_OPT = typer.Option(None, "--name", help="Wallet (coldkey) name; default: backends.yaml's bittensor.wallet.")
PATH_OPT = typer.Option(None, "--path", help="Folder of the wallets; default: backends.yaml's, else ~/.bittensor/wallets.")
HOTKEY_OPT = typer.Option(None, "--hotkey", help="Hotkey name; default: backends.yaml's, else 'default'.")
PASSWORD_FILE_OPT = typer.Option(None, "--password-file", help="File (mode 0600) holding the coldkey's password; "
                                                               "default: asked at the terminal.")
NO_PASSWORD_OPT = typer.Option(False, "--no-password", help="Leave the coldkey unencrypted (tests only).")


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="wallet", rich_markup_mode=None, no_args_is_help=True,
                        help="The Bittensor wallet that pays miners (coldkey) and signs requests (hotkey).")
    group.command("create")(create)
    group.command("import")(import_)
    group.command("show")(show)
    group.command("balance")(balance)
    app.add_typer(group, name="wallet")


def create(name: str = typer.Option(..., "--name", help="Wallet (coldkey) name."), path: str = PATH_OPT,
           hotkey: str = HOTKEY_OPT, password_file: str = PASSWORD_FILE_OPT, no_password: bool = NO_PASSWORD_OPT,
           as_json: bool = JSON_OPT) -> None:
    """Make a new wallet: a coldkey encrypted with a password, and a hotkey. Its mnemonic is shown once, on a terminal."""
    from trainmaster.wallet import tao_wallet

    name, path, hotkey = _where(name, path, hotkey)
    password = _new_password(password_file, no_password)
    info, mnemonic = _guarded(lambda: tao_wallet.create(name, path, hotkey, password=password))
    if sys.stdout.isatty() and not as_json:
        console().print(f"mnemonic of the coldkey (shown this once; write it down, offline):\n  {escape(mnemonic)}",
                        highlight=False, soft_wrap=True)
    else:
        console(stderr=True).print("note: the mnemonic is shown only on a terminal without --json; the coldkey file keeps it",
                                   highlight=False)
    del mnemonic
    _print(info, as_json, f"created wallet {name}")


def import_(name: str = typer.Option(..., "--name", help="Wallet (coldkey) name to make."), path: str = PATH_OPT,
            hotkey: str = HOTKEY_OPT,
            mnemonic_file: str = typer.Option(None, "--mnemonic-file", help="File (mode 0600) holding the mnemonic."),
            seed_file: str = typer.Option(None, "--seed-file", help="File (mode 0600) holding the hex seed."),
            password_file: str = PASSWORD_FILE_OPT, no_password: bool = NO_PASSWORD_OPT,
            as_json: bool = JSON_OPT) -> None:
    """Restore a coldkey from a mnemonic or seed file (never given on the command line: others can read it)."""
    from trainmaster.wallet import tao_wallet

    if (mnemonic_file is None) == (seed_file is None):
        fail("give exactly one of --mnemonic-file or --seed-file", USAGE)
    name, path, hotkey = _where(name, path, hotkey)
    secret = _guarded(lambda: tao_wallet.read_secret_file(mnemonic_file or seed_file))
    password = _new_password(password_file, no_password)
    words = {"mnemonic": secret} if mnemonic_file else {"seed": secret}
    info = _guarded(lambda: tao_wallet.import_key(name, path, hotkey, password=password, **words))
    del secret, words
    _print(info, as_json, f"imported wallet {name}")


def show(name: str = NAME_OPT, path: str = PATH_OPT, hotkey: str = HOTKEY_OPT, as_json: bool = JSON_OPT) -> None:
    """The wallet's addresses (coldkey and hotkey ss58), its files, and whether the coldkey is encrypted."""
    from trainmaster.wallet import tao_wallet

    name, path, hotkey = _where(name, path, hotkey)
    _print(_guarded(lambda: tao_wallet.show(name, path, hotkey)), as_json, f"wallet {name}")


def balance(name: str = NAME_OPT, path: str = PATH_OPT,
            network: str = typer.Option(None, "--network", help="finney, test, local or a ws:// URL; "
                                                                "default: backends.yaml's bittensor.network."),
            as_json: bool = JSON_OPT) -> None:
    """The coldkey's free balance, read from the chain (integer rao in --json)."""
    import asyncio

    from trainmaster.wallet import tao_wallet

    name, path, _ = _where(name, path, None)
    network = network or _bittensor().network
    info = _guarded(lambda: tao_wallet.show(name, path, "default"))
    rao = _guarded(lambda: asyncio.run(_free_rao(network, info.coldkey_ss58)))
    if as_json:
        print(json.dumps({"wallet": name, "coldkey_ss58": info.coldkey_ss58, "network": network, "free_rao": rao}))
        return
    console().print(f"{escape(info.coldkey_ss58)} on {escape(network)}: {tao_text(rao)} TAO free", highlight=False)


def tao_text(rao: int) -> str:
    """Integer rao as TAO with all nine decimals, through integers only."""
    sign = "-" if rao < 0 else ""
    return f"{sign}{abs(rao) // 10**9}.{abs(rao) % 10**9:09d}"


async def _free_rao(network: str, ss58: str) -> int:
    from trainmaster.wallet.chain import Chain

    chain = await Chain.open(network)
    try:
        return await chain.free_rao(ss58)
    finally:
        await chain.close()


def _bittensor():
    """backends.yaml's bittensor section (its defaults when the file has none)."""
    from trainmaster.backends.bittensor.config import BittensorConfig
    from trainmaster.broker.backend_set import read_configs

    found = guarded(read_configs).get("bittensor")
    return found if found is not None else BittensorConfig()


def _where(name: str | None, path: str | None, hotkey: str | None) -> tuple[str, str, str]:
    if name is not None and path is not None and hotkey is not None:
        return name, path, hotkey
    wallet = _bittensor().wallet
    return name or wallet.name, path or wallet.path, hotkey or wallet.hotkey


def _new_password(password_file: str | None, no_password: bool) -> str | None:
    """The password a new coldkey is encrypted with (None with --no-password, which is for tests)."""
    from trainmaster.wallet import tao_wallet

    if no_password:
        if password_file:
            fail("--no-password and --password-file contradict each other", USAGE)
        console(stderr=True).print("warning: the coldkey is left unencrypted (--no-password is for tests only)",
                                   highlight=False)
        return None
    if password_file:
        return _guarded(lambda: tao_wallet.read_secret_file(password_file))
    if not sys.stdin.isatty():
        fail("no terminal to ask the coldkey's password at: give --password-file", USAGE)
    import getpass

    first = getpass.getpass("password for the new coldkey: ")
    if not first or first != getpass.getpass("again: "):
        fail("the passwords are empty or do not match; nothing was made", USAGE)
    return first


def _guarded(fn):
    """Run `fn`; a wallet or chain error is a message and exit code 2, naming no secret."""
    from trainmaster.wallet.chain import ChainUnreachable
    from trainmaster.wallet.tao_wallet import WalletError

    try:
        return fn()
    except (WalletError, ChainUnreachable) as exc:
        fail(str(exc), USAGE)


def _print(info, as_json: bool, title: str) -> None:
    fields = dict(info.__dict__)
    if as_json:
        print(json.dumps(fields))
        return
    out = console()
    out.print(title, highlight=False)
    for key, value in fields.items():
        if key not in ("name",):
            out.print(f"  {key}: {escape(str(value))}", highlight=False)

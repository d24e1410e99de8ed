"""Starting a miner: its home (made private), its settings, its wallet's hotkey (never the coldkey), and the
port, each refused with one clear line (StartError) before anything is served; then the routes until
SIGINT or SIGTERM.

The home is the TRAINMASTER_HOME of the local backend that runs the miner's attempts, never a broker's."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
from pathlib import Path


class StartError(Exception):
    """The miner cannot start; the message says why in one line."""


def prepare_home(home: str | Path) -> Path:
    """The home, made (mode 0700) when missing, and this process's TRAINMASTER_HOME."""
    path = Path(home).expanduser().absolute()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise StartError(f"cannot make the miner's home {path}: {exc.strerror}") from None
    os.environ["TRAINMASTER_HOME"] = str(path)
    return path


def load_hotkey(wallet: str, hotkey: str, wallet_path: str | Path):
    """The wallet's hotkey (a Keypair). Its coldkey is never read."""
    from bittensor.wallet import Wallet

    found = Wallet(name=wallet, hotkey=hotkey, path=str(Path(wallet_path).expanduser()))
    keyfile = found.hotkey_file
    if not keyfile.exists_on_device():
        raise StartError(f"no hotkey {hotkey!r} in wallet {wallet!r} under {wallet_path} "
                         f"(expected {keyfile.path}); make one with `btcli wallet new_hotkey`")
    if keyfile.is_encrypted():
        raise StartError(f"the hotkey {keyfile.path} is encrypted; a miner signs unattended, with a plaintext hotkey")
    try:
        return found.hotkey
    except Exception as exc:  # the SDK raises its own kinds for an unreadable or malformed keyfile
        raise StartError(f"cannot read the hotkey {keyfile.path}: {type(exc).__name__}") from None


def load_settings(home: Path, config: str | Path | None):
    from trainmaster.backends.bittensor.miner.config import load_config
    from trainmaster.jobs.yamlfile import FileError

    try:
        return load_config(home, Path(config).expanduser() if config else None)
    except FileError as exc:
        raise StartError(str(exc).replace("\n", "; ")) from None


def serve(*, wallet: str, wallet_path: str, hotkey: str, host: str, port: int, home: str, config: str | None) -> None:
    """Serve until stopped; StartError when the miner cannot start."""
    root = prepare_home(home)
    settings = load_settings(root, config)
    keypair = load_hotkey(wallet, hotkey, wallet_path)
    if settings.confine and os.geteuid() != 0:
        raise StartError("confining strangers' jobs needs root (each job runs as its own unprivileged user); start "
                         "the miner as root, or set `confine: false` in miner.yaml to run jobs as yourself (they can "
                         "then read your wallet and home)")
    wallet_dir = Path(wallet_path).expanduser() / wallet
    asyncio.run(_serve(root, keypair, settings, host, port, wallet_dir))


async def _serve(home: Path, keypair, settings, host: str, port: int, wallet_dir: Path) -> None:
    from aiohttp import web

    from trainmaster.backends.bittensor.miner.app import Miner

    runner = web.AppRunner(Miner(home, keypair, settings, wallet_dir=wallet_dir).app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        in_use = exc.errno == errno.EADDRINUSE
        raise StartError(f"port {port} on {host} is in use" if in_use else
                         f"cannot listen on {host}:{port}: {exc.strerror}") from None
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    sys.stderr.write(f"miner {keypair.ss58_address} serving on http://{host}:{port} (home {home})\n")
    sys.stderr.flush()
    await stop.wait()
    await runner.cleanup()

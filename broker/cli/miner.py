"""`trainmaster miner serve`: rent out this machine's GPUs (or CPU) to brokers, as a Bittensor miner.

The miner (backends/bittensor/miner/) answers the miner protocol (docs/miner-protocol.md) on 127.0.0.1
unless told otherwise, signs with its wallet's hotkey only, and runs each job with the local backend in
its own home. Module-level imports stay typer-only so `trainmaster --help` stays fast.
"""

from __future__ import annotations

import typer

from trainmaster.broker.cli.exits import USAGE, fail


def register(app: typer.Typer) -> None:
    group = typer.Typer(name="miner", rich_markup_mode=None, no_args_is_help=True,
                        help="Serve jobs to brokers as a Bittensor miner (docs/miner-protocol.md).")
    group.command("serve")(serve)
    app.add_typer(group, name="miner")


def serve(
    wallet: str = typer.Option(..., "--wallet", help="The wallet whose hotkey signs (its coldkey is never read)."),
    wallet_path: str = typer.Option("~/.bittensor/wallets", "--wallet-path", help="Folder that holds the wallets."),
    hotkey: str = typer.Option("default", "--hotkey", help="The wallet's hotkey to sign with."),
    port: int = typer.Option(8091, "--port", min=0, max=65535, help="Port to listen on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    home: str = typer.Option("~/.trainmaster-miner", "--home", help="The miner's own folder: its jobs, bundles, "
                                                                    "database and miner.yaml."),
    config: str = typer.Option(None, "--config", help="Settings file (default: miner.yaml in the home)."),
) -> None:
    """Serve the miner protocol until interrupted."""
    from trainmaster.backends.bittensor.miner.serve import StartError
    from trainmaster.backends.bittensor.miner.serve import serve as run

    try:
        run(wallet=wallet, wallet_path=wallet_path, hotkey=hotkey, host=host, port=port, home=home, config=config)
    except StartError as exc:
        fail(str(exc), USAGE)

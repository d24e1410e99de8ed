"""`python -m cheating_miners KIND <miner serve options>`: the reference miner's own command (`trainmaster
miner serve`), with the cheat KIND installed first (miners.install)."""

from __future__ import annotations

import sys

from cheating_miners import KINDS


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in KINDS:
        sys.stderr.write(f"usage: python -m cheating_miners {{{','.join(KINDS)}}} <miner serve options>\n")
        sys.exit(2)
    from cheating_miners.miners import install
    from trainmaster.broker import cli

    install(sys.argv[1])
    sys.argv = ["trainmaster", "miner", "serve", *sys.argv[2:]]
    cli.main()


if __name__ == "__main__":
    main()

"""The real `trainmaster` CLI with the Bittensor chain it reaches replaced by the in-memory chain of
tests/fake_chain.py, kept in a JSON file between processes (so several CLI runs see one chain):

    python tests/cli_with_chain.py CHAIN.json [trainmaster args…]

Only the SDK's `Substrate` object is replaced (as tests/wallet/test_tao_payments.py does): wallet/chain.py, the TAO
sender, the coldkey's signatures, the ledger and the settlement are the real ones. CHAIN.json holds the
balances, nonces, head and landed transfers; it is made by `save(path, FakeSubstrate(...))`. The processes the CLI
starts (a read's background pass, broker/cli/background.py) use the same chain (tests/child_site/sitecustomize.py).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fake_chain import FakeSubstrate, Landed  # noqa: E402


class FileChain(FakeSubstrate):
    """A FakeSubstrate loaded from `path`, written back on close (wallet/chain.py closes it after each use)."""

    def __init__(self, path: Path):
        data = json.loads(Path(path).read_text())
        super().__init__(free=data["free"], nonces=data["nonces"], head=data["head"],
                         landed=[Landed(**x) for x in data["landed"]], signed=data["signed"], mode=data["mode"])
        self.path = Path(path)

    async def close(self) -> None:
        save(self.path, self)


def save(path: Path, chain: FakeSubstrate) -> None:
    data = {"free": chain.free, "nonces": chain.nonces, "head": chain.head, "signed": chain.signed, "mode": chain.mode,
            "landed": [dataclasses.asdict(x) for x in chain.landed]}
    Path(path).write_text(json.dumps(data))


def load(path: Path) -> FakeSubstrate:
    return FileChain(path)


def use_chain(path) -> None:
    """Every chain this process opens is the one kept in `path`."""
    from trainmaster.wallet.chain import Chain

    async def open_chain(cls, network: str) -> Chain:
        return cls(FileChain(Path(path)), "test")

    Chain.open = classmethod(open_chain)


if __name__ == "__main__":
    state = Path(sys.argv[1])
    use_chain(state)
    from child_hooks import hooked

    hooked(f"chain={state}")
    sys.argv = ["trainmaster", *sys.argv[2:]]
    from trainmaster.broker.cli import main

    main()

"""The one place the wallet talks to the Bittensor chain: balance reads and TAO transfers, over the SDK's
chain-access contract (`bittensor.Substrate`; production: `bittensor.RpcSubstrate`).

Every call here is one SDK call (`query`, `block_number`, `finalized_block_number`, `compose`, `account_next_index`,
`sign_extrinsic`, `submit_signed`, `block_hash`, `find_extrinsic`), so a test replaces only the
Substrate object, with a fake whose methods have the SDK's names and signatures
(tests/wallet/test_tao_payments.py checks them with `inspect`). A transfer is signed first and submitted
after: its extrinsic hash (blake2b-256 of the signed bytes) and the mortal era it lives in are known
before anything reaches the chain, so the caller records them first. Amounts are integer rao throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

ERA_PERIOD = 64
"""Blocks a signed transfer stays valid for (a mortal era); after them it can never be included."""


class ChainUnreachable(RuntimeError):
    """The chain did not answer (no node at the endpoint, a dropped connection); names the network."""


@dataclass(frozen=True)
class SignedTransfer:
    """A transfer signed and not yet submitted: its bytes, its hash, the signer's nonce it uses, and the blocks
    it can be included in (`first_block` ≤ its block ≤ `last_block`)."""

    data: bytes
    extrinsic_hash: str
    nonce: int
    first_block: int
    last_block: int


@dataclass(frozen=True)
class Inclusion:
    """Where a transfer landed and whether it took effect (a failed dispatch moved no money)."""

    block: int
    block_hash: str | None
    success: bool
    message: str


def _connection_errors() -> tuple[type[BaseException], ...]:
    from bittensor import ConnectionNotReady, RpcConnectionError

    return (RpcConnectionError, ConnectionNotReady, ConnectionError, TimeoutError, OSError)


class Chain:
    """The SDK calls the wallet makes, on one `bittensor.Substrate` for `network`."""

    def __init__(self, substrate, network: str):
        self.substrate, self.network = substrate, network

    @classmethod
    async def open(cls, network: str) -> Chain:
        """Connect to `network` (finney, test, local or a ws:// URL) through the SDK's RPC backend, pinned to
        that one endpoint."""
        from bittensor import RpcSubstrate
        from bittensor.settings import resolve_endpoint

        label, endpoint = resolve_endpoint(network)
        chain = cls(RpcSubstrate(endpoint, fallback_endpoints=[], archive_endpoints=[]), label)
        await chain._call(chain.substrate.connect())
        return chain

    async def close(self) -> None:
        await self.substrate.close()

    async def _call(self, awaitable):
        try:
            return await awaitable
        except _connection_errors() as exc:
            raise ChainUnreachable(f"the {self.network} chain is unreachable: {exc}") from None

    async def free_rao(self, ss58: str) -> int:
        """The free balance of `ss58`, in rao (the read `bittensor.reads.accounts.balance` makes)."""
        account = await self._call(self.substrate.query("System", "Account", [ss58]))
        return int(account["data"]["free"]) if account else 0

    async def head(self) -> int:
        return int(await self._call(self.substrate.block_number()))

    async def finalized(self) -> int:
        """The newest finalized block: nothing at or below it changes any more."""
        return int(await self._call(self.substrate.finalized_block_number()))

    async def sign_transfer(self, keypair, dest_ss58: str, rao: int) -> SignedTransfer:
        """Sign `Balances.transfer_keep_alive(dest, rao)` with `keypair` at its next nonce; nothing is submitted."""
        from bittensor import calls

        if not isinstance(rao, int) or isinstance(rao, bool) or rao <= 0:
            raise ValueError(f"a transfer moves a positive whole number of rao, not {rao!r}")
        call = await self._call(self.substrate.compose(calls.Balances.transfer_keep_alive(dest=dest_ss58, value=rao)))
        nonce = await self._call(self.substrate.account_next_index(keypair.ss58_address))
        first = await self.head()
        data, extrinsic_hash = await self._call(
            self.substrate.sign_extrinsic(call, keypair, nonce=nonce, period=ERA_PERIOD))
        return SignedTransfer(data=bytes(data), extrinsic_hash=extrinsic_hash, nonce=int(nonce), first_block=first,
                              last_block=first + ERA_PERIOD)

    async def submit(self, transfer: SignedTransfer, keypair) -> Inclusion | None:
        """Submit the signed bytes and wait for finalization: where it landed, or None when the chain
        refused it before inclusion (the caller reconciles by hash: a resend of the same bytes is refused too)."""
        from bittensor._transport.contract import SignedExtrinsic

        extrinsic = SignedExtrinsic(data=transfer.data, extrinsic_hash=transfer.extrinsic_hash)
        result = await self._call(self.substrate.submit_signed(extrinsic, keypair, wait_for_inclusion=True,
                                                               wait_for_finalization=True))
        if result.block_hash is None:
            return None
        block = int(result.extrinsic_id.split("-")[0]) if result.extrinsic_id else -1
        return Inclusion(block=block, block_hash=result.block_hash, success=result.success, message=result.message)

    async def find(self, transfer_hash: str, first_block: int, last_block: int) -> Inclusion | None:
        """The block among `first_block`..`last_block` (as far as the chain has reached) holding the extrinsic."""
        head = await self.head()
        for number in range(first_block, min(last_block, head) + 1):
            block_hash = await self._call(self.substrate.block_hash(number))
            result = await self._call(self.substrate.find_extrinsic(transfer_hash, block_hash))
            if result is not None:
                return Inclusion(block=number, block_hash=block_hash, success=result.success, message=result.message)
        return None

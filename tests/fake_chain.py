"""An in-memory Bittensor chain at the SDK's chain-access boundary (`bittensor.Substrate`): no chain is
reachable in tests, so this answers the calls wallet/chain.py makes as the SDK's RPC backend would, with
the SDK's own types (`bittensor.calls.Call`, `ExtrinsicResult`, real sr25519 signatures by the signer's
`Keypair`). tests/wallet/test_tao_payments.py checks that every method here has the real method's signature.

Blocks are numbered from 1; each submitted transfer that is included gets a block of its own, final at once.
A signed transfer is valid only at its signer's current nonce and up to `period` blocks after it was signed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Optional

from bittensor import ExtrinsicResult
from bittensor._generated.calls import Call
from bittensor._transport.contract import SignedExtrinsic


@dataclass
class Landed:
    block: int
    extrinsic_hash: str
    dest: str
    rao: int
    success: bool


@dataclass
class FakeSubstrate:
    free: dict[str, int] = field(default_factory=dict)
    nonces: dict[str, int] = field(default_factory=dict)
    head: int = 100
    landed: list[Landed] = field(default_factory=list)
    signed: dict[str, dict] = field(default_factory=dict)
    mode: str = "include"
    """include | lose_answer (included, then the connection drops) | drop (never reaches a block) | offline"""
    token_symbols: dict[int, str] = field(default_factory=dict)

    def _online(self) -> None:
        if self.mode == "offline":
            from bittensor import RpcConnectionError

            raise RpcConnectionError("connection refused")

    # the SDK's Substrate methods wallet/chain.py uses

    async def connect(self) -> None:
        self._online()

    async def close(self) -> None:
        return None

    async def query(self, module: str, storage_function: str, params: Optional[list] = None,
                    block_hash: Optional[str] = None) -> Any:
        self._online()
        assert (module, storage_function) == ("System", "Account")
        who = params[0]
        return {"nonce": self.nonces.get(who, 0), "data": {"free": self.free.get(who, 0), "reserved": 0, "frozen": 0}}

    async def block_number(self) -> int:
        self._online()
        return self.head

    async def finalized_block_number(self) -> int:
        self._online()
        return self.head

    async def block_hash(self, block: Optional[int] = None) -> str:
        return f"0x{(self.head if block is None else block):064x}"

    async def compose(self, call) -> Any:
        self._online()
        assert isinstance(call, Call) and (call.module, call.function) == ("Balances", "transfer_keep_alive")
        return call

    async def account_next_index(self, address: str) -> int:
        self._online()
        return self.nonces.get(address, 0)

    async def sign_extrinsic(self, call, keypair, *, nonce: int, period: int) -> tuple[bytes, str]:
        body = json.dumps({"call": [call.module, call.function, call.params], "signer": keypair.ss58_address,
                           "nonce": nonce, "born": self.head, "period": period}, sort_keys=True).encode()
        data = body + bytes(keypair.sign(body))
        extrinsic_hash = "0x" + hashlib.blake2b(data, digest_size=32).hexdigest()
        self.signed[extrinsic_hash] = json.loads(body)
        return data, extrinsic_hash

    async def find_extrinsic(self, extrinsic_hash: str, block_hash: str) -> Optional[ExtrinsicResult]:
        self._online()
        for landed in self.landed:
            if landed.extrinsic_hash == extrinsic_hash and block_hash == await self.block_hash(landed.block):
                return self._result(landed)
        return None

    async def submit_signed(self, extrinsic, keypair, *, wait_for_inclusion: bool = True,
                            wait_for_finalization: bool = True) -> ExtrinsicResult:
        self._online()
        assert isinstance(extrinsic, SignedExtrinsic)
        if self.mode == "drop":
            raise ConnectionError("the connection dropped before the transfer reached the pool")
        tx = self.signed[extrinsic.extrinsic_hash]
        if tx["nonce"] != self.nonces.get(tx["signer"], 0) or self.head > tx["born"] + tx["period"]:
            return ExtrinsicResult(success=False, message="Invalid Transaction: Transaction is outdated")
        landed = self._apply(tx, extrinsic.extrinsic_hash)
        if self.mode == "lose_answer":
            raise ConnectionError("the connection dropped while waiting for finalization")
        return self._result(landed)

    # what a test drives and reads

    def advance(self, blocks: int) -> None:
        self.head += blocks

    def paid(self, dest: str) -> int:
        return sum(landed.rao for landed in self.landed if landed.dest == dest and landed.success)

    def _apply(self, tx: dict, extrinsic_hash: str) -> Landed:
        signer, (_, _, params) = tx["signer"], tx["call"]
        self.nonces[signer] = tx["nonce"] + 1
        self.head += 1
        ok = self.free.get(signer, 0) >= params["value"]
        if ok:
            self.free[signer] -= params["value"]
            self.free[params["dest"]] = self.free.get(params["dest"], 0) + params["value"]
        landed = Landed(self.head, extrinsic_hash, params["dest"], params["value"], ok)
        self.landed.append(landed)
        return landed

    def _result(self, landed: Landed) -> ExtrinsicResult:
        return ExtrinsicResult(success=landed.success, message="Success" if landed.success else "Balances.InsufficientBalance",
                               block_hash=f"0x{landed.block:064x}", extrinsic_id=f"{landed.block}-0001")

"""Bittensor miners: rented training runs, quoted, dispatched, audited and concluded over the miner protocol
(protocol.py), signed with the broker's hotkey (auth.py); the broker's side is backend.py."""

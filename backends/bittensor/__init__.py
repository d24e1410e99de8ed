"""Bittensor miners (planned: runs are not dispatched, nor quotes gathered, in this version)."""

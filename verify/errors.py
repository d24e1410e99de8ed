"""The one exception the verification module raises for a result it cannot accept."""

from __future__ import annotations

from typing import Literal

Kind = Literal["rejected", "cannot_verify"]


class VerificationError(Exception):
    """A check failed. ``kind`` says whose fault it is.

    ``rejected``: the returned work is bad (tampered, unsafe, wrong, too poor) — the executor is blamed.
    ``cannot_verify``: the check could not be carried out (missing settings, our evaluator crashed) —
    nobody is paid, nobody is blamed, a person looks at it.
    """

    def __init__(self, reason: str, *, kind: Kind = "rejected"):
        super().__init__(reason)
        self.reason = reason
        self.kind: Kind = kind

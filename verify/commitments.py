"""Commitments that were verified and stored: the only thing a challenge can be drawn from.

A :class:`StoredCommitment` cannot be built by hand. :class:`CommitmentStore` creates one only
after the signature (or, for a trusted executor, the fields) checked out *and* the commitment was
written to the database, so no code path can draw a challenge for a commitment that is not yet
fixed. An attempt commits once: a second, different commitment for the same attempt is refused as
equivocation.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from pathlib import Path

from trainmaster.jobs.commitment import Commitment

from .errors import VerificationError
from .records import Database, commitment_row, insert_commitment, other_commitments
from .signing import check_fields, check_signature

_TOKEN = object()


@dataclass(frozen=True)
class StoredCommitment:
    """A verified commitment as stored; ``signature`` and ``hotkey`` are None for trusted executors."""

    job_id: str
    attempt_id: str
    commitment: Commitment
    signature: str | None
    hotkey: str | None
    stored_at: float
    _token: InitVar[object] = field(default=None)

    def __post_init__(self, _token: object) -> None:
        if _token is not _TOKEN:
            raise TypeError("a StoredCommitment is made only by CommitmentStore, after the commitment is verified and stored")

    @property
    def signed(self) -> bool:
        return self.signature is not None


class CommitmentStore:
    def __init__(self, path: Path):
        self.database = Database(path)

    def close(self) -> None:
        self.database.close()

    def store(
        self,
        commitment: Commitment,
        *,
        attempt_id: str,
        signature: str | None,
        hotkey: str,
        expected_job_id: str,
        expected_bundle_sha256: str,
        expected_k: int,
        expected_n: int,
        alongside: frozenset[str] = frozenset(),
    ) -> StoredCommitment:
        """Verify an untrusted executor's signed commitment against the spec, then store it. `alongside`: the
        attempts run as a refereed pair with this one (the same seed), whose root it is meant to equal."""
        check_signature(commitment, signature, hotkey)
        check_fields(
            commitment, expected_job_id=expected_job_id, expected_bundle_sha256=expected_bundle_sha256,
            expected_k=expected_k, expected_n=expected_n,
        )
        self._refuse_reuse(commitment, attempt_id, alongside)
        return self._insert(commitment, attempt_id, signature, hotkey)

    def _refuse_reuse(self, commitment: Commitment, attempt_id: str, alongside: frozenset[str] = frozenset()) -> None:
        """Each untrusted attempt trains from its own S_0 (its seed comes from a nonce the broker chose),
        so a root or a final model another attempt of the job already committed is a reused run —
        typically a rejected one re-signed by a new hotkey, hoping for a luckier challenge. The two attempts of
        a refereed pair share their seed, and equal roots are what they are run for."""
        rows = [row for row in other_commitments(self.database.db, commitment.job_id, attempt_id)
                if row["attempt_id"] not in alongside]
        for row in rows:
            earlier = Commitment.from_json(row["commitment_json"].encode("ascii"))
            same = "root" if earlier.root == commitment.root else "final model" if (
                earlier.final_sha256 == commitment.final_sha256) else None
            if same:
                raise VerificationError(
                    f"this run was already committed by attempt {row['attempt_id']} of the job (the same {same}); "
                    "a run is never accepted twice, and each attempt trains from its own seed"
                )

    def store_trusted(
        self,
        commitment: Commitment,
        *,
        attempt_id: str,
        expected_job_id: str,
        expected_bundle_sha256: str,
        expected_k: int,
        expected_n: int,
    ) -> StoredCommitment:
        """Store a trusted backend's commitment (it has no hotkey), its fields checked against the spec."""
        check_fields(
            commitment, expected_job_id=expected_job_id, expected_bundle_sha256=expected_bundle_sha256,
            expected_k=expected_k, expected_n=expected_n,
        )
        return self._insert(commitment, attempt_id, None, None)

    def get(self, job_id: str, attempt_id: str) -> StoredCommitment | None:
        """A stored commitment, its signature checked again (the database is not trusted blindly)."""
        row = commitment_row(self.database.db, job_id, attempt_id)
        if row is None:
            return None
        commitment = Commitment.from_json(row["commitment_json"].encode("ascii"))
        if row["signature"] is not None:
            check_signature(commitment, row["signature"], row["hotkey"])
        return _stored(row, commitment)

    def _insert(self, commitment: Commitment, attempt_id: str, signature: str | None, hotkey: str | None) -> StoredCommitment:
        text = commitment.canonical_json().decode("ascii")
        with self.database.write() as db:
            row = commitment_row(db, commitment.job_id, attempt_id)
            if row is None:
                insert_commitment(db, commitment.job_id, attempt_id, text, signature, hotkey)
                row = commitment_row(db, commitment.job_id, attempt_id)
            elif row["commitment_json"] != text or row["hotkey"] != hotkey:
                raise VerificationError(
                    f"attempt {attempt_id} already committed to root {_root_of(row['commitment_json'])[:12]}…; "
                    f"a second, different commitment (root {commitment.root[:12]}…) is equivocation"
                )
        return _stored(row, commitment)


def _stored(row, commitment: Commitment) -> StoredCommitment:
    return StoredCommitment(
        row["job_id"], row["attempt_id"], commitment, row["signature"], row["hotkey"], row["stored_at"], _TOKEN
    )


def _root_of(commitment_json: str) -> str:
    return Commitment.from_json(commitment_json.encode("ascii")).root

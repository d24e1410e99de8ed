"""A folder's verdict told as what it is: outputs of unknown origin, not a job's attempt.

`verify DIR` runs the pipeline with no fetch record, no executor and (unless its commitment says) no
job, so the pipeline's own words for those fields would mislead: a job id taken from the folder's name,
`outputs_checked: 0`, and a signature "not required (trusted executor)" beside `trust: untrusted`. This
rewrites them: no job id unless the folder's commitment names one, the folder and the trust it was
judged with, how many files it holds, and why no signature could be checked."""

from __future__ import annotations

from pathlib import Path

NO_RECORD = "none: a folder has no record of what was fetched, so no recorded size or hash is compared"


def as_folder(verdict, folder: Path, *, trusted: bool, spec_given: bool):
    """`verdict` (of the pipeline, on `folder`) with a folder's honest evidence."""
    evidence = dict(verdict.evidence)
    integrity = {k: v for k, v in (evidence.get("integrity") or {}).items() if k != "outputs_checked"}
    if integrity or "integrity" in evidence:
        integrity["recorded_outputs"] = NO_RECORD
        if "signature" in integrity:
            integrity["signature"] = _signature(spec_given)
        evidence["integrity"] = integrity
    commitment = integrity.get("commitment") or {}
    evidence["folder"] = {"path": str(folder.resolve()), "files": _count_files(folder),
                          "judged_as": "trusted compute's outputs (--trusted)" if trusted
                          else "untrusted compute's outputs (its origin is unknown)"}
    return verdict.model_copy(update={"evidence": evidence, "job_id": commitment.get("job_id"), "attempt_id": None})


def _signature(spec_given: bool) -> str:
    fields = ("its commitment's fields were checked against --spec" if spec_given
              else "its commitment's fields were not checked (no --spec)")
    return f"not checked: a folder has no executor whose key could have signed it; {fields}"


def _count_files(folder: Path) -> int:
    from trainmaster.jobs.output_tree import walk

    return len(walk(folder).files)

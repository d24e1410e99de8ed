"""Verify one returned attempt: integrity → safety → replay audit → outcome, then the verdict.

Which checks run is the caller's decision (the broker takes it from the policy); the safe default
is all four for an untrusted executor and all but the replay audit for a trusted one. The checks
run in order and stop at the first that fails, except that the safety check still runs after the
integrity check rejects, so that every bad file is reported together. A failed check gives ``rejected`` or
``cannot_verify`` with its reason; any other exception gives ``cannot_verify`` — never an accept.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainmaster.jobs.files import HostileFile, read_regular

from .errors import VerificationError
from .verdict import FILENAME as VERDICT_FILE
from .verdict import Verdict

if TYPE_CHECKING:
    from trainmaster.jobs.commitment import Commitment
    from trainmaster.jobs.spec import JobSpec

    from .audit import AuditReport
    from .commitments import StoredCommitment
    from .openings import Openings
    from .output_kinds import FileKind
    from .recipe_run import RecipeRun, UserRecipeRun

CHECKS = ("integrity", "safety", "replay", "outcome")
COLLECTED_WITH_INTEGRITY = "safety"
"""The check that still runs after the integrity check rejects, so the two report together."""
TRUSTED_CHECKS = frozenset({"integrity", "safety", "outcome"})
UNTRUSTED_CHECKS = frozenset(CHECKS)

COMMITMENT_FILE = "commitment.json"
SIGNATURE_FILE = "commitment.sig"
MODEL_FILE = "model.safetensors"
WEIGHTS_FILES = {MODEL_FILE, "weights.safetensors"}
CHECKPOINTS_DIR = "checkpoints"
LISTED = 20
"""How many bad files a reason names before "and N more"."""
SEGMENT_FILES = f"{CHECKPOINTS_DIR}/segments/*"
"""Every file under the checkpoint segments (docs/runtime.md, "Checkpoints on disk"; ``*`` spans folders)."""


@dataclass(frozen=True)
class Attempt:
    """What the broker knows about one returned attempt.

    ``recorded_outputs``: ``(relative path, size, sha256)`` of every file as fetched.
    ``total_steps``: T, so that n = T/k can be checked (default: the recipe config's ``steps``).
    ``expected_weights``: the tensors of W0 (``name -> (dtype, shape)``) that the final and segment
    weights must have. ``signature``: the commitment signature; read from ``commitment.sig`` in the
    outputs if None. ``openings``: where the audit gets the challenged segments (default: the
    ``checkpoints/`` directory in the outputs). ``open_segments``: asked, with the challenged segment
    indices once they are drawn, for the executor's openings of them (a remote executor). ``outputs_hashed``:
    the recorded hashes were computed while fetching just now, so integrity checks only that each file is
    still there with its size. ``recipe_run``: what the audit re-executes (default:
    from the spec's entrypoint). ``exact_replay``: the executor is one of our own deterministic
    backends, so the audit requires bitwise-identical states (r = 0). A spec whose ``recipe:`` is a
    module of the bundle is audited in a child process (``verify/recipe_audit.py``) importing it from
    the job's code, with the job's interpreter; the evaluator runs in that code too.

    The job's code is ``bundle`` (the tar the broker sent) extracted afresh into ``workspace``, its
    sha256 checked against ``bundle_sha256`` — never the attempt's own code directory, which its
    training process could rewrite; ``code_dir`` (a tree the caller owns and vouches for) only when no
    bundle is given.
    """

    job_id: str
    attempt_id: str
    outputs: Path
    bundle_sha256: str
    spec: JobSpec | None = None
    trusted: bool = False
    hotkey: str | None = None
    signature: str | None = None
    recorded_outputs: tuple[tuple[str, int, str], ...] = ()
    total_steps: int | None = None
    expected_weights: Mapping[str, tuple[str, tuple[int, ...]]] | None = None
    max_file_bytes: int | None = None
    code_dir: Path | None = None
    """A code tree the caller owns (the user's own, bundled afresh by `trainmaster verify DIR --spec`);
    used only when no ``bundle`` is given."""
    bundle: Path | None = None
    """The bundle tar the broker sent: extracted afresh for the evaluator and a job's own recipe."""
    workspace: Path | None = None
    """A broker-owned directory the bundle is extracted into (default: the system's temporary directory)."""
    previous_metrics: Mapping[str, float] | None = None
    openings: Openings | None = None
    open_segments: Callable[[list[int]], Openings] | None = None
    outputs_hashed: bool = False
    seed: int | None = None
    """The seed the attempt ran with, when it is not the spec's (an untrusted attempt's, derived from a nonce)."""
    recipe_run: RecipeRun | None = None
    exact_replay: bool = False
    python: str | None = None
    """The interpreter the evaluator and a job's own recipe run with; default: the job's virtualenv in
    ``envs_dir`` when its spec has one (``environment: {python: requirements}``), else the broker's."""
    envs_dir: Path | None = None
    """Where the broker caches job virtualenvs by their requirements' hash (``jobs/venvs.py``)."""
    dropped: tuple[str, ...] = ()
    """Files the executor returned that its commitment does not bind (verify/committed.py): not recorded
    as outputs, listed in the integrity evidence, judged by the safety check, deleted by the broker after."""
    referee: Mapping[str, Any] | None = None
    """The refereed tier's ruling on this attempt and its pair (broker/stages/refereeing.py), kept as the verdict's
    ``referee`` evidence: when it upheld the attempt, the replay audit is not among the checks."""
    pair: tuple[str, ...] = ()
    """The other attempts of its refereed pair: they share its seed, so their commitment's root may equal its own."""
    tier: str | None = None
    """The verification tier the broker resolved (the spec's, else the policy's for its class); default the spec's."""
    outputs_trusted: bool | None = None
    """How the outputs are judged: pickle-capable files kept opaque (True) or refused (False), and a
    self-reported ``result.json`` taken as metrics or not; default ``trusted``. `trainmaster verify
    DIR` judges a folder of unknown origin strictly with no executor to check."""


Audit = Callable[..., "AuditReport"]
"""``trainmaster.verify.audit.run_audit``'s keyword signature; replaceable for tests."""


@dataclass(frozen=True)
class AuditSettings:
    """Where the replay audit's tolerance comes from: an explicit τ, or the job class's calibration."""

    calibration_dir: Path | None = None
    tau: float | None = None


@dataclass
class _Run:
    """What one verification has established so far; ``scratch``: where the bundle was extracted."""

    attempt: Attempt
    db_path: Path | None
    commitment: Commitment | None = None
    stored: StoredCommitment | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    scratch: Path | None = None


def default_checks(trusted: bool) -> frozenset[str]:
    return TRUSTED_CHECKS if trusted else UNTRUSTED_CHECKS


def verify_attempt(
    attempt: Attempt,
    *,
    checks: Collection[str] | None = None,
    db_path: Path | None = None,
    audit_settings: AuditSettings = AuditSettings(),
    audit: Audit | None = None,
    evaluate: Callable[[Path], Mapping[str, float]] | None = None,
    write_verdict: bool = True,
) -> Verdict:
    """Run the checks, store the verdict in ``db_path`` (when given), write ``verdict.json`` next to the outputs.

    ``db_path`` (the broker's state.db) is needed for a replay audit: the commitment is stored there
    before the challenge is drawn. A failure to store the verdict raises (the broker retries).
    """
    wanted = frozenset(default_checks(attempt.trusted) if checks is None else checks)
    if unknown := wanted - set(CHECKS):
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {', '.join(CHECKS)}")
    run = _Run(attempt, db_path or None)
    if attempt.referee is not None:
        run.evidence["referee"] = dict(attempt.referee)
    elif not attempt.trusted and "replay" not in wanted:  # judged by its outcome alone: the verdict says what that risks
        from .trust import outcome_only_evidence

        run.evidence["trust"] = outcome_only_evidence()
    stages = {
        "integrity": lambda: _integrity(run, "replay" in wanted),
        "safety": lambda: _safety(run),
        "replay": lambda: _replay(run, audit_settings, audit),
        "outcome": lambda: _outcome(run, evaluate),
    }
    try:
        verdict = _run_checks(run, [c for c in CHECKS if c in wanted], stages)
    finally:
        if run.scratch is not None:
            shutil.rmtree(run.scratch, ignore_errors=True)
    _record(verdict, run, write_verdict)
    return verdict


def _run_checks(run: _Run, names: list[str], stages: Mapping[str, Callable[[], dict[str, Any]]]) -> Verdict:
    """Run the checks in order until one fails; the verdict. A rejection by the integrity check still
    runs the safety check (which needs nothing integrity establishes), so that a wrong hash does not
    hide an unsafe or corrupt file: both are reported together."""
    ran: list[str] = []
    outcome, reasons = "accepted", []
    for name in names:
        ran.append(name)
        outcome, reasons = _run_check(run, name, stages[name])
        if outcome != "accepted":
            if name == "integrity" and outcome == "rejected" and COLLECTED_WITH_INTEGRITY in names:
                ran.append(COLLECTED_WITH_INTEGRITY)
                also, more = _run_check(run, COLLECTED_WITH_INTEGRITY, stages[COLLECTED_WITH_INTEGRITY])
                reasons += more if also == "rejected" else []
            break
    return Verdict(
        outcome=outcome, reasons=reasons, checks=ran, evidence=run.evidence,
        job_id=run.attempt.job_id, attempt_id=run.attempt.attempt_id,
    )


def _run_check(run: _Run, name: str, stage: Callable[[], dict[str, Any]]) -> tuple[str, list[str]]:
    """One check: its outcome and reasons, its evidence stored (``{"failed": reason}`` when it failed)."""
    try:
        run.evidence[name] = stage()
        return "accepted", []
    except VerificationError as exc:
        outcome, reasons = exc.kind, [exc.reason]
    except HostileFile as exc:  # a link, FIFO, device or oversized file the executor left: its fault
        outcome, reasons = "rejected", [f"the {name} check refused {exc}"]
    except Exception as exc:  # noqa: BLE001 — any failure to check is "cannot verify", never an accept
        outcome, reasons = "cannot_verify", [f"the {name} check failed to run: {type(exc).__name__}: {exc}"]
    run.evidence.setdefault(name, {"failed": reasons[0]})
    return outcome, reasons


def _record(verdict: Verdict, run: _Run, write_verdict: bool) -> None:
    if run.db_path is not None:
        from .records import VerdictStore

        store = VerdictStore(run.db_path)
        try:
            store.record(verdict)
        finally:
            store.close()
    if write_verdict:
        verdict.write(Path(run.attempt.outputs).parent / VERDICT_FILE)


# integrity


def _integrity(run: _Run, replay: bool) -> dict[str, Any]:
    outputs = Path(run.attempt.outputs)
    if not outputs.is_dir():
        raise VerificationError(f"the outputs directory {outputs} does not exist", kind="cannot_verify")
    evidence: dict[str, Any] = {
        "outputs_checked": _check_recorded(outputs, run.attempt.recorded_outputs, rehash=not run.attempt.outputs_hashed)
    }
    if run.attempt.dropped:
        evidence["dropped"] = list(run.attempt.dropped)
    _check_not_empty(outputs, run.attempt.spec)
    path = outputs / COMMITMENT_FILE
    if not os.path.lexists(path):  # a link or a FIFO of that name is refused by the read, never followed
        if replay and run.attempt.spec is not None and not _makes_commitment(run.attempt):
            from .trust import JOB_FAULT, NO_COMMITMENT

            run.evidence[JOB_FAULT] = NO_COMMITMENT  # the job's shape, not the executor: nobody is banned
            raise VerificationError(NO_COMMITMENT, kind="cannot_verify")
        if replay:
            raise VerificationError(
                f"no {COMMITMENT_FILE} in the outputs: the run did not commit to its states, so it cannot be audited",
                kind="cannot_verify" if run.attempt.trusted else "rejected",
            )
        evidence["commitment"] = None
        return evidence
    run.commitment = _read_commitment(path)
    evidence["commitment"] = run.commitment.model_dump()
    evidence["signature"] = _check_commitment(run, replay)
    final = outputs / MODEL_FILE
    if not final.is_file():
        raise VerificationError(f"the commitment names final weights, but the outputs hold no {MODEL_FILE}")
    from .signing import check_final

    recorded = {relative: sha256 for relative, _, sha256 in run.attempt.recorded_outputs}
    check_final(run.commitment, final, sha256=recorded.get(MODEL_FILE))  # checked above: not hashed twice
    evidence["final_sha256"] = run.commitment.final_sha256
    return evidence


def _makes_commitment(attempt: Attempt) -> bool:
    """Whether the attempt's job trains through the runtime (its spec's recipe, or the recipe run the caller gives)."""
    from .recipe_run import runs_runtime_recipe

    return attempt.recipe_run is not None or runs_runtime_recipe(attempt.spec)


def _check_not_empty(outputs: Path, spec: JobSpec | None) -> None:
    """A run that wrote nothing to its outputs folder failed, unless its spec says outputs are optional."""
    if spec is not None and spec.outputs.optional:
        return
    from trainmaster.jobs.output_tree import walk

    tree = walk(outputs)  # bounded; what it refuses is the safety check's to report
    if not tree.files and not tree.refused:
        raise VerificationError(
            "the run wrote no outputs: nothing is in its outputs folder ($TRAINMASTER_OUTPUT_DIR), and files written "
            "anywhere else are not kept; write results there, or set `outputs: {optional: true}` in the job spec"
        )


def _check_recorded(outputs: Path, recorded: tuple[tuple[str, int, str], ...], *, rehash: bool = True) -> int:
    """Every file recorded at fetch time is still there with its size (and, unless it was hashed just
    now while being fetched, its sha256), so each recorded sha256 is the file's now."""
    from trainmaster.jobs.files import sha256_file

    bad = []
    for relative, size, sha256 in recorded:
        path = outputs / relative
        try:
            found = os.lstat(path)  # one call for the kind (a link is not a regular file) and the size
        except OSError:
            found = None
        if found is None or not stat.S_ISREG(found.st_mode):
            bad.append(f"output {relative} is missing")
        elif found.st_size != size or (rehash and sha256_file(path) != sha256):
            bad.append(f"output {relative} does not match the size and sha256 recorded when it was fetched")
    if bad:
        raise VerificationError("; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else ""))
    return len(recorded)


def _read_commitment(path: Path):
    from trainmaster.jobs.commitment import CommitmentError, read_commitment

    try:
        return read_commitment(path)
    except CommitmentError as exc:
        raise VerificationError(f"{path.name}: {exc}") from exc


def _check_commitment(run: _Run, replay: bool) -> str:
    """Check the commitment's fields (and signature, for an untrusted executor); store it for the audit."""
    from .signing import check_fields, verify_commitment

    attempt, commitment = run.attempt, run.commitment
    if attempt.trusted and attempt.spec is None and not replay:
        return "not required (trusted executor); fields not checked (no job spec)"
    expected = _expected_fields(attempt, commitment, replay)
    if attempt.trusted:
        if replay:
            run.stored = _store(run, trusted=True, expected=expected)
        else:
            check_fields(commitment, **expected)
        return "not required (trusted executor)"
    if not attempt.hotkey:
        raise VerificationError("the executor is untrusted but no hotkey was recorded at dispatch", kind="cannot_verify")
    signature = attempt.signature or _read_signature(Path(attempt.outputs) / SIGNATURE_FILE)
    if replay:
        run.stored = _store(run, trusted=False, expected=expected, signature=signature)
    else:
        verify_commitment(commitment, signature, attempt.hotkey, **expected)
    return f"valid for {attempt.hotkey}"


def _expected_fields(attempt: Attempt, commitment, replay: bool) -> dict[str, Any]:
    if attempt.spec is None:
        raise VerificationError("no job spec was given, so k and n cannot be checked", kind="cannot_verify")
    k = attempt.spec.checkpoint.segment_steps
    total = attempt.total_steps or _recipe_steps(attempt)
    if total is None:
        if replay and not attempt.trusted and not _own_recipe(attempt):  # a job's own recipe: its audit checks n
            raise VerificationError(
                "the total steps T are unknown, so n = T/k cannot be checked for an untrusted executor",
                kind="cannot_verify",
            )
        n = commitment.n  # nothing fixes T: the run's own n stands
    elif total % k:
        raise VerificationError(f"the spec's T = {total} is not a multiple of k = {k}", kind="cannot_verify")
    else:
        n = total // k
    return {"expected_job_id": attempt.job_id, "expected_bundle_sha256": attempt.bundle_sha256, "expected_k": k, "expected_n": n}


def _recipe_steps(attempt: Attempt) -> int | None:
    """T from the recipe config, when the spec runs a shipped recipe (a job's own is never imported here), read
    without importing the recipe: a check that replays nothing never imports torch for it."""
    from .recipe_run import NotReplayable, recipe_config

    try:
        config = attempt.recipe_run.config if attempt.recipe_run is not None else recipe_config(attempt.spec)
        return int(config["steps"])
    except NotReplayable:
        return None


def _own_recipe(attempt: Attempt) -> bool:
    """Whether the audit re-executes the job's own recipe (the spec names one in its bundle)."""
    return attempt.recipe_run is None and attempt.spec is not None and attempt.spec.bundle_recipe is not None


def _user_recipe(attempt: Attempt) -> UserRecipeRun | None:
    """The job's own recipe run (NotReplayable when it cannot be re-executed), or None for a shipped one."""
    import dataclasses

    from .recipe_run import user_recipe

    if not _own_recipe(attempt):
        return None
    run = user_recipe(attempt.spec)
    return run if attempt.seed is None else dataclasses.replace(run, seed=attempt.seed)


def _recipe_run(attempt: Attempt) -> RecipeRun:
    import dataclasses

    from .recipe_run import recipe_run

    run = attempt.recipe_run or recipe_run(attempt.spec)
    return run if attempt.seed is None else dataclasses.replace(run, seed=attempt.seed)


def _read_signature(path: Path) -> str | None:
    from .record_limits import MAX_SIGNATURE_BYTES

    try:
        return read_regular(path, MAX_SIGNATURE_BYTES).decode("ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, HostileFile) as exc:
        raise VerificationError(f"{path.name} is unreadable: {exc}") from exc


def _store(run: _Run, *, trusted: bool, expected: dict[str, Any], signature: str | None = None):
    if run.db_path is None:
        raise VerificationError("a replay audit needs the database to store the commitment in", kind="cannot_verify")
    from .commitments import CommitmentStore

    store = CommitmentStore(run.db_path)
    try:
        if trusted:
            return store.store_trusted(run.commitment, attempt_id=run.attempt.attempt_id, **expected)
        return store.store(
            run.commitment, attempt_id=run.attempt.attempt_id, signature=signature, hotkey=run.attempt.hotkey,
            alongside=frozenset(run.attempt.pair), **expected
        )
    finally:
        store.close()


# safety


def _safety(run: _Run) -> dict[str, Any]:
    """Every returned file judged by its content (verify/output_kinds.py) and by trust.

    Links, FIFOs, sockets, devices, over-deep folders, over-full trees and files parsed whole that
    are over their size limit are refused, all of them listed (jobs/output_tree.py,
    verify/record_limits.py); zip archives are looked into, and every .safetensors is checked, in
    child processes under memory and CPU limits, whatever the trust. Pickle-capable and unchecked files are kept
    OPAQUE — never loaded here, listed in the evidence — from trusted compute, and refused from
    untrusted compute.
    NaN and ±Inf (and bool bytes other than 0 and 1) are refused in every .safetensors except the
    checkpoint segments' (:data:`SEGMENT_FILES`), whose headers alone are checked: each segment is
    committed by the signed Merkle root, the replay audit opens the challenged ones and parses them
    strictly (verify/openings.py: non-finite weights refused, the rest judged by the recipe's field
    rules, where NaN can be a sentinel such as DQN's ``last_loss`` before learning starts), and an
    unchallenged one is never loaded. Reading every segment's values cost a whole checkpoint
    directory's bytes (docs/audit.md, "Measured").
    """
    from trainmaster.jobs.output_tree import walk

    from .output_kinds import CONVERT, DATA, HOSTILE, SAFETENSORS
    from .record_limits import oversized
    from .safeload import check_files_isolated

    outputs, attempt = Path(run.attempt.outputs), run.attempt
    trusted = _outputs_trusted(attempt)
    tree = walk(outputs)
    problems, refused, tensor_files, relatives, opaque = tree.refused + oversized(tree.files), [], {}, {}, []
    for (relative, entry), found in _kinds(tree.files):
        path = Path(entry.path)
        if found.kind == SAFETENSORS:
            tensor_files[path] = attempt.expected_weights if entry.name in WEIGHTS_FILES else None
            relatives[str(path)] = relative
        elif found.kind == DATA:
            continue
        elif found.kind == HOSTILE:
            problems.append(f"{relative} is {found.what}")
        elif trusted:
            opaque.append({"path": relative, "kind": found.kind, "what": found.what})
        else:
            refused.append(f"{relative} is {found.what}")
    segments = [path for path in tensor_files if fnmatch.fnmatchcase(relatives[str(path)], SEGMENT_FILES)]
    checked = {}
    results = (
        check_files_isolated(tensor_files, max_bytes=attempt.max_file_bytes, headers_only=segments) if tensor_files else []
    )
    for result in results:
        relative = relatives[result.path]
        if result.reason:
            problems.append(f"{relative}: {result.reason.removeprefix(Path(result.path).name + ': ')}")
        else:
            checked[relative] = {"bytes": result.size, "tensors": result.tensors}
    if refused:
        problems.append("refused from untrusted compute, since loading them can run code or their content is not a "
                        "format identified as safe: " + _few(refused, "; ") + "; " + CONVERT)
    if problems:
        raise VerificationError("unsafe outputs: " + _few(problems, "; "))
    return {
        "trust": "trusted" if trusted else "untrusted", "safetensors_checked": checked,
        "headers_only": len(segments), "opaque": opaque,
    }


def _outputs_trusted(attempt: Attempt) -> bool:
    """Whether the outputs are judged as trusted compute's: pickle-capable files kept opaque (not refused),
    and a self-reported ``result.json`` taken as evidence."""
    return attempt.trusted if attempt.outputs_trusted is None else attempt.outputs_trusted


def _kinds(files) -> list[tuple[tuple[str, os.DirEntry], FileKind]]:
    """Each file's kind (verify/output_kinds.py); zip archives are looked into together in a child
    process under CPU and memory limits (verify/archive_child.py)."""
    from .archive_child import classify_archives
    from .output_kinds import ARCHIVE, classify

    found = [((item.relative, item.entry), classify(Path(item.entry.path), archives=False)) for item in files]
    archives = [entry.path for (_, entry), kind in found if kind.kind == ARCHIVE]
    looked = classify_archives([Path(p) for p in archives]) if archives else {}
    return [(where, looked.get(where[1].path, kind)) for where, kind in found]


def _few(items: list[str], sep: str) -> str:
    shown = items[:LISTED]
    return sep.join(shown) + (f"{sep}and {len(items) - len(shown)} more" if len(items) > len(shown) else "")


# replay audit


def _replay(run: _Run, settings: AuditSettings, audit: Audit | None) -> dict[str, Any]:
    """Draw the challenge from the stored commitment, have the challenged segments opened and re-executed."""
    from .challenge import Challenge

    attempt = run.attempt
    if run.stored is None:
        raise VerificationError("the replay audit needs a verified, stored commitment", kind="cannot_verify")
    own = _user_recipe(attempt)
    job = _recipe_run(attempt) if own is None else None
    choice = _verifier(run, settings, job) if job is not None else None  # a job's own recipe: chosen in its child
    verification = attempt.spec.verification
    challenge = Challenge.for_commitment(run.stored, _secret(run), q=verification.challenge_segments,
                                         tail=verification.tail_segments)
    tier = attempt.tier or verification.tier or "sampled"
    chunks = verification.boundary_chunks if tier != "replay" else None  # a refereed job audited alone: sampled
    if own is not None:
        report = _audit_own_recipe(run, own, challenge.segments, settings, chunks)
    else:
        report = (audit or _run_audit())(
            commitment=run.stored.commitment,
            openings=_openings(attempt, challenge.segments),
            segments=list(challenge.segments),
            recipe=job.recipe,
            config=job.config,
            seed=job.seed,
            tau=settings.tau,
            calibration=choice.calibration,
            trusted_exact=attempt.exact_replay,
            device=choice.device,
            calibration_note=choice.note,
            boundary_chunks=chunks,
        )
    run.evidence["replay"] = {"challenge": challenge.message(), **report.model_dump(mode="json")}
    _raise_for(report)
    return run.evidence["replay"]


def _raise_for(report: AuditReport) -> None:
    """A report that did not pass: rejected, or — every check passed but S_0 could not be judged on this machine
    (another CPU kernel set, verify/initial_state.py) — cannot_verify: unpaid, unbanned, to verify again elsewhere."""
    if report.cannot_judge is not None:
        raise VerificationError("the replay audit cannot be completed here: " + report.cannot_judge, kind="cannot_verify")
    if not report.passed:
        raise VerificationError("the replay audit failed: " + "; ".join(report.reasons[:5]))


def _audit_own_recipe(run: _Run, own: UserRecipeRun, segments, settings: AuditSettings,
                      chunks: int | None = None) -> AuditReport:
    """The audit of the job's own recipe, in a child process importing it from the verified bundle."""
    from .openings import LocalOpenings
    from .recipe_audit import audit_user_recipe

    attempt = run.attempt
    openings = _openings(attempt, segments)
    if not isinstance(openings, LocalOpenings):
        raise VerificationError(
            "the job's own recipe is audited in a child process, which reads the openings from a directory",
            kind="cannot_verify",
        )
    code = _job_code(run, "its own recipe's audit")
    from .verifier_device import wanted_device

    return audit_user_recipe(
        own, commitment=run.stored.commitment, openings_dir=openings.checkpoint_dir, segments=segments,
        code_dir=code, tau=settings.tau, calibration_dir=settings.calibration_dir, trusted_exact=attempt.exact_replay,
        python=_interpreter(attempt, code), env=attempt.spec.env, device=wanted_device(), boundary_chunks=chunks,
    )


def _job_code(run: _Run, needed_for: str) -> Path:
    """The job's code: the bundle extracted afresh (once per verification, its sha256 checked), or the
    caller's own ``code_dir`` when no bundle is given."""
    attempt = run.attempt
    if attempt.bundle is None:
        if attempt.code_dir is None or not Path(attempt.code_dir).is_dir():
            raise VerificationError(f"the job's code is needed for {needed_for}, but no bundle and no code "
                                    "directory was given", kind="cannot_verify")
        return Path(attempt.code_dir)
    if run.scratch is None:
        run.scratch = _extract_fresh(attempt, needed_for)
    return run.scratch / "code"


def _extract_fresh(attempt: Attempt, needed_for: str) -> Path:
    """A new directory in the workspace holding ``code/``: the bundle, its sha256 checked, extracted now."""
    import tempfile

    from trainmaster.jobs.bundle import BundleError, extract_bundle

    if attempt.workspace is not None:
        Path(attempt.workspace).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="code-", dir=attempt.workspace))
    try:
        extract_bundle(attempt.bundle, scratch / "code", expected_sha256=attempt.bundle_sha256)
    except BundleError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise VerificationError(f"the job's bundle cannot be extracted for {needed_for}: {exc}",
                                kind="cannot_verify") from exc
    return scratch


def _interpreter(attempt: Attempt, code: Path) -> str | None:
    """The interpreter the job's code runs with here: the given one, else the virtualenv the broker built
    for the requirements in ``code`` (when the spec asks for one and it is built), else None (the broker's)."""
    if attempt.python is not None:
        return attempt.python
    if attempt.spec is None or attempt.envs_dir is None or attempt.spec.environment.python != "requirements":
        return None
    from trainmaster.jobs.venvs import built_python

    return built_python(attempt.envs_dir, code / attempt.spec.environment.requirements)


def _secret(run: _Run) -> bytes:
    from .records import SecretStore

    secrets = SecretStore(run.db_path)
    try:
        return secrets.secret_for(run.attempt.job_id, run.attempt.attempt_id)
    finally:
        secrets.close()


def _openings(attempt: Attempt, segments) -> Openings:
    """Where the challenged segments are read from: given openings, the executor (asked now, after the
    commitment is stored), or the outputs' own checkpoints."""
    if attempt.openings is not None:
        return attempt.openings
    if attempt.open_segments is not None:
        return attempt.open_segments(list(segments))
    return _local_openings(attempt)


def _local_openings(attempt: Attempt) -> Openings:
    from .openings import LocalOpenings

    directory = Path(attempt.outputs) / CHECKPOINTS_DIR
    if not directory.is_dir():
        raise VerificationError(
            f"no openings: the outputs hold no {CHECKPOINTS_DIR}/ and no transport was given to ask the executor",
            kind="cannot_verify",
        )
    return LocalOpenings(directory)


def _verifier(run: _Run, settings: AuditSettings, job: RecipeRun):
    """Where the challenged segments are re-executed and with which calibration (verify/verifier_device.py):
    the executor's device kind is the one its signed commitment states."""
    from .verifier_device import choose

    executor = run.stored.commitment.device_kind
    return choose(executor, job.job_class, calibration_dir=settings.calibration_dir, tau=settings.tau,
                  exact=run.attempt.exact_replay)


def _run_audit() -> Audit:
    from .audit import run_audit

    return run_audit


# outcome


def _outcome(run: _Run, evaluate) -> dict[str, Any]:
    from .outcome import check_outcome

    attempt = run.attempt
    settings = attempt.spec.verification if attempt.spec is not None else None
    thresholds = dict(settings.thresholds) if settings else {}
    evaluator = settings.evaluator if settings else None
    final = Path(attempt.outputs) / MODEL_FILE
    if (thresholds or evaluator or evaluate) and not final.is_file():
        raise VerificationError(f"there is no {MODEL_FILE} in the outputs to evaluate")
    code = _job_code(run, "its evaluator") if evaluator and evaluate is None else None
    result = check_outcome(
        final, thresholds=thresholds, evaluator=evaluator, code_dir=code, evaluate=evaluate,
        outputs=Path(attempt.outputs), trust_reported=_outputs_trusted(attempt), previous=attempt.previous_metrics,
        python=_interpreter(attempt, code) if code else None,
        env=attempt.spec.env if attempt.spec is not None else None,
    )
    run.evidence["outcome"] = result.model_dump()
    if not result.passed:
        raise VerificationError("outcome below the bar: " + "; ".join(result.failures))
    return run.evidence["outcome"]

"""`trainmaster verify …`: show a job's stored verdict, or check a directory of outputs.

Exit codes: 0 accepted, 1 rejected, 2 cannot verify (or nothing to show). Module-level imports
stay at typer alone; everything else is imported inside the command, so `trainmaster --help`
stays fast. `verify calibrate` is in `calibrate`.
"""

from __future__ import annotations

from pathlib import Path

import typer
from typer.core import TyperGroup

EXIT_CANNOT_VERIFY = 2
NO_SPEC = "outcome not checked: no --spec given"


class _ShowByDefault(TyperGroup):
    """`trainmaster verify JOB_ID|DIR` is `trainmaster verify show JOB_ID|DIR`."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


def register(app: typer.Typer) -> None:
    """Add the `verify` group to the `trainmaster` app."""
    from trainmaster.broker.cli import calibrate

    verify_app = typer.Typer(
        name="verify", cls=_ShowByDefault, rich_markup_mode=None, no_args_is_help=True,
        help="Verdicts on returned work: integrity, safety, replay audits, outcome. "
        "`trainmaster verify JOB_ID|DIR` shows one (same as `verify show`).",
    )
    verify_app.command("show")(show)
    calibrate.register(verify_app)
    app.add_typer(verify_app, name="verify")


def show(
    target: str = typer.Argument(..., metavar="JOB_ID|DIR", help="A job id (or unique prefix), or a directory of outputs."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    trusted: bool = typer.Option(
        False, "--trusted",
        help="For a directory: it came from compute you trust, so pickle-capable files are kept opaque "
        "(listed, never loaded) instead of refused.",
    ),
    again: bool = typer.Option(
        False, "--again", help="For a job whose checks could not run (unverified): run them again, then show the verdict.",
    ),
    spec: Path | None = typer.Option(
        None, "--spec", metavar="FILE", dir_okay=False,
        help="For a directory: the job spec whose outcome check (evaluator, thresholds) to run on it; its "
        "code: is resolved from this file, as `submit` does. Nothing in the directory is ever run or read as "
        "configuration.",
    ),
) -> None:
    """Print the stored verdict of a job, or check a directory of outputs (integrity, safety, and the
    outcome when --spec names a job spec). A directory is of unknown origin: nothing in it is run or
    read as configuration, and it is judged as untrusted compute's outputs (pickle-capable files refused,
    its own result.json no evidence) unless --trusted is given. Exit 0 accepted, 1 rejected, 2 cannot
    verify."""
    if not target.strip():  # Path("") is the current directory: never judge it by accident
        _fail("empty job reference: give a job id, a unique prefix of one, or a directory")
    path = Path(target)
    folder, note = path.is_dir() and not again, None
    if folder:
        folder, note = _folder_or_job(target)  # a job of that very id wins over the folder of its name
    if spec is not None and (again or not folder):
        _fail(f"--spec applies to a directory of outputs; {target} is not one (a job's verdict used the job's own spec)")
    if again:
        from trainmaster.broker.cli import calls
        from trainmaster.broker.cli.exits import guarded

        _, job = guarded(lambda: calls.verify_again(target))
        target = job.id
    if folder:
        verdict = _check_directory(path, trusted=trusted, spec_path=spec)
    else:
        verdict = _stored_verdict(target)
    if note:
        typer.echo(f"note: {note}", err=True)
    if as_json:
        typer.echo(verdict.to_json(), nl=False)
    else:
        _print(verdict)
        if folder and not trusted and "refused from untrusted compute" in " ".join(verdict.reasons):
            typer.echo("(a folder of unknown origin is judged as untrusted compute's outputs; "
                       "--trusted keeps pickle-capable files opaque instead)")
    raise typer.Exit(verdict.exit_code)


def _folder_or_job(target: str) -> tuple[bool, str | None]:
    """Whether `target`, an existing folder, is checked as that folder, and a note when a job was chosen instead.

    A reference written as a path (`./name`, `../name`, `/abs`, `~/name`, anything with a slash) is the folder. A
    bare name is a job first: when a job with a verdict has exactly that id, the job wins (the folder `trainmaster
    outputs JOB` made is named so); when it only starts such a job's id, the command cannot tell and asks; else it is
    the folder."""
    if "/" in target or target in (".", "..") or target.startswith("~"):
        return True, None
    from trainmaster.broker import paths
    from trainmaster.verify.records import VerdictStore

    db = paths.state_db()
    if isinstance(db, Path) and not db.is_file():
        return True, None
    store = VerdictStore(db)
    try:
        ids = store.matching_jobs(target)
    finally:
        store.close()
    if target in ids:
        return False, f"{target} is a job and a folder here: showing the job's verdict (write ./{target} for the folder)"
    if ids:
        _fail(f"{target!r} is a folder here and the start of job {ids[0]!r}: write ./{target} to check the folder, "
              "or the job's whole id")
    return True, None


def _stored_verdict(job_ref: str):
    from trainmaster.broker import paths
    from trainmaster.verify.records import VerdictStore

    db = paths.state_db()
    if isinstance(db, Path) and not db.is_file():  # (a database server always answers)
        _fail(f"no verdicts yet: {db} does not exist")
    store = VerdictStore(db)
    try:
        from trainmaster.broker.store import SHOWN, several_jobs

        ids = store.matching_jobs(job_ref, most=SHOWN + 1)
        if len(ids) > 1:  # as `trainmaster status` says it
            _fail(several_jobs(job_ref, ids))
        verdict = store.latest(ids[0]) if ids else None
        if verdict is not None and verdict.evidence.get("judged_with"):  # a refereed partner accepted with its lead:
            verdict = store.latest(ids[0], verdict.evidence["judged_with"]) or verdict  # the lead's has the checks
    finally:
        store.close()
    if verdict is None:
        _fail(f"no verdict for a job {job_ref!r} (nor a directory of that name)")
    return verdict


def _check_directory(outputs: Path, *, trusted: bool, spec_path: Path | None):
    """Integrity and safety of a directory of outputs, plus the outcome check of the spec the user named.

    Nothing in the directory is run or read as configuration: the spec and the evaluator's code come
    from ``spec_path`` alone (its code bundled and extracted afresh, as `submit` would send it). There is
    no executor to check a signature against, so the commitment is checked as a trusted one's;
    ``trusted`` decides how the outputs are judged (pickle-capable files opaque or refused, a
    self-reported result.json taken or not)."""
    import tempfile

    from trainmaster.jobs.commitment import CommitmentError, read_commitment
    from trainmaster.verify.pipeline import COMMITMENT_FILE, Attempt, verify_attempt

    loaded = _load_spec(spec_path) if spec_path else None
    try:
        commitment = read_commitment(outputs / COMMITMENT_FILE) if (outputs / COMMITMENT_FILE).is_file() else None
    except CommitmentError:
        commitment = None  # the integrity check reports it
    with tempfile.TemporaryDirectory(prefix="trainmaster-verify-") as scratch:
        attempt = Attempt(
            job_id=commitment.job_id if commitment else outputs.resolve().name,
            attempt_id="local-check",
            outputs=outputs,
            bundle_sha256=commitment.bundle_sha256 if commitment else "",
            spec=loaded.spec if loaded else None,
            trusted=True,
            outputs_trusted=trusted,
            code_dir=_fresh_code(loaded, Path(scratch)) if loaded and loaded.spec.verification.evaluator else None,
            envs_dir=_envs_dir() if loaded else None,
        )
        checks = {"integrity", "safety"} | ({"outcome"} if loaded else set())
        verdict = verify_attempt(attempt, checks=checks, write_verdict=False)
    from trainmaster.broker.cli.folder_evidence import as_folder

    verdict = as_folder(verdict, outputs, trusted=trusted, spec_given=loaded is not None)
    return verdict if loaded else _outcome_not_checked(verdict)


def _envs_dir() -> Path:
    """Where the job environments the outcome check runs the evaluator with are built (backends.yaml's
    `local.envs_dir`, else the home's: broker/backend_set.py); an invalid backends.yaml exits with its errors."""
    from trainmaster.broker.backend_set import envs_dir
    from trainmaster.broker.cli.exits import load

    return load(envs_dir)


def _outcome_not_checked(verdict):
    """The verdict, its evidence saying that no outcome was checked (no spec was named)."""
    return verdict.model_copy(update={"evidence": {**verdict.evidence, "outcome": {"checked": False, "why": NO_SPEC}}})


def _load_spec(spec_path: Path):
    from trainmaster.jobs.spec import load_spec
    from trainmaster.jobs.yamlfile import FileError

    try:
        return load_spec(spec_path)
    except FileError as exc:
        _fail(str(exc))


def _fresh_code(loaded, scratch: Path) -> Path:
    """The spec's code, bundled as `submit` would and extracted afresh under ``scratch`` (its sha256 checked)."""
    from trainmaster.broker.cli.fresh_code import fresh_code
    from trainmaster.jobs.bundle import BundleError

    try:
        return fresh_code(loaded, scratch)
    except BundleError as exc:
        _fail(f"{loaded.path}: code: {exc}")


def _print(verdict) -> None:
    """The verdict for people; every name and reason through `visible`, so no file name can draw on the terminal."""
    from trainmaster.broker.cli.safe_text import visible

    folder = (verdict.evidence.get("folder") or {}).get("path")
    where = visible(verdict.job_id or (f"folder {folder}" if folder else "?"))
    if verdict.attempt_id:
        where += f" (attempt {visible(verdict.attempt_id)})"
    typer.echo(f"{where}: {verdict.outcome.replace('_', ' ').upper()}")
    typer.echo(f"checks: {visible(', '.join(verdict.checks) or 'none')}")
    if (verdict.evidence.get("outcome") or {}).get("checked") is False:
        typer.echo(f"{NO_SPEC} (a folder's own files are never run, nor read as its spec)")
    from trainmaster.broker.cli.save_hints import with_hint
    from trainmaster.verify.output_kinds import CONVERT

    for reason in verdict.reasons:
        typer.echo(f"  - {visible(with_hint(reason, CONVERT))}")
    for line in _replay_and_trust(verdict.evidence):
        typer.echo(visible(line))
    opaque = (verdict.evidence.get("safety") or {}).get("opaque") or []
    if opaque:
        typer.echo("opaque (kept, never loaded by trainmaster; load them only if you trust where they came from):")
        for item in opaque:
            typer.echo(f"  - {visible(item['path'])}: {visible(item['what'])}")


def _tier_lines(replay: dict) -> list[str]:
    """Which tier audited, which segments were replayed, which boundaries and chunks were opened, and each
    boundary check's worst measurement against its bound (the whole list: `--json`)."""
    if not replay.get("tier"):
        return []
    segments = [s.get("index") for s in replay.get("segments") or []]
    lines = [f"tier: {replay['tier']}; replayed segments {', '.join(map(str, segments)) or 'none'}"]
    found = replay.get("boundaries") or {}
    if not found:
        return lines
    per = found.get("per_boundary") or {}
    lines.append(f"boundaries: {found.get('boundaries', 0)} opened and tied to the root, {found.get('chunks', 0)} chunks "
                 f"({found.get('bytes_opened', 0) / 1e6:.2f} MB; e.g. boundary {next(iter(per), '?')}: "
                 f"{', '.join((next(iter(per.values()), None) or [])[:4])})")
    worst: dict[str, dict] = {}
    for m in found.get("measurements") or []:
        kept = worst.get(m["check"])
        if kept is None or (kept["passed"] and not m["passed"]):
            worst[m["check"]] = m
    for check, m in worst.items():
        failed = sum(1 for x in found["measurements"] if x["check"] == check and not x["passed"])
        total = sum(1 for x in found["measurements"] if x["check"] == check)
        lines.append(f"  {check}: {total - failed}/{total} within bound"
                     + (f"; at {m['at']}: {m['measured']} vs {m['bound']}" if failed else f" (bound {m['bound']})"))
    return lines


def _replay_and_trust(evidence: dict) -> list[str]:
    """Where the replay audit re-executed (its device, the executor's, the calibration's pair), and the risk of
    outcome-only trust, when the verdict holds them."""
    from trainmaster.broker.cli.referee_text import referee_lines

    lines = referee_lines(evidence)  # the refereed tier's ruling first: it says why a replay ran, or none did
    replay = evidence.get("replay") or {}
    if replay.get("device"):
        pair = replay.get("calibration_pair")
        line = (f"replayed on {replay['device']} (executor trained on {replay.get('executor_device', 'cpu')}; "
                f"τ from {'the ' + pair + ' calibration' if pair else replay.get('tau_source', '?')})")
        lines.append(line + (f"; {replay['calibration_note']}" if replay.get("calibration_note") else ""))
    lines += _initial_lines(replay.get("initial_state") or {})
    lines += _tier_lines(replay)
    trust = evidence.get("trust") or {}
    if trust.get("risk"):
        lines.append(f"warning: {trust['risk']}")
    return lines


def _initial_lines(initial: dict) -> list[str]:
    """Which S_0 the executor's was compared with: built with the kernel set its commitment names (docs/audit.md)."""
    if initial.get("rebuilt") != "child":
        return []
    judged = {True: "equal", False: "differs"}.get(initial.get("matched"), f"not judged: {initial.get('reason')}")
    return [f"S_0 rebuilt with the executor's CPU kernels ({initial.get('kernels')}; this verifier: "
            f"{initial.get('verifier_kernels')}): {judged}"]


def _fail(message: str) -> None:
    from trainmaster.broker.cli.safe_text import visible

    typer.echo(f"error: {visible(message)}", err=True)
    raise typer.Exit(EXIT_CANNOT_VERIFY)

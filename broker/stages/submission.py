"""Submission, where a job's life starts: the spec checked, planned under the policy, bundled and recorded.

`prepare` does all of it but write (what `submit --dry-run` shows); `submit` builds the bundle, puts it in the
shared storage, records the job with its plan and a snapshot of its policy, and hands it to the state machine.
Nothing is recorded unless the spec, the plan and the bundle are good.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass
from pathlib import Path

from trainmaster.backends.retry import retried
from trainmaster.broker import paths
from trainmaster.broker.filekeeping import shared_bundles, shared_storage
from trainmaster.broker.planning.planner import Plan, PlanError
from trainmaster.broker.planning.policy import Policy, load_policy
from trainmaster.broker.stages.job_context import Parts
from trainmaster.broker.stages.offer_rounds import budget_refusal, plan, record_plan, start_preview
from trainmaster.broker.stages.verification import checks_for
from trainmaster.jobs import bundle as bundles
from trainmaster.jobs.launch_checks import launch_problems
from trainmaster.jobs.spec import JobSpec, LoadedSpec, load_spec


@dataclass(frozen=True)
class Prepared:
    """A spec checked, bundled in memory and planned: what `submit --dry-run` shows."""

    loaded: LoadedSpec
    policy: Policy
    plan: Plan
    bundle: bundles.BundleInfo
    warnings: tuple[str, ...] = ()
    """What will happen to the run's outputs on the chosen offer, and code lines that may write pickles."""
    budget: str | None = None
    """Why a budget would refuse the dispatch now (submit would fail the job with this reason)."""
    start: str | None = None
    """Whether the job would start now or wait in the queue (backends that allocate a machine)."""


def left_out_warning(left_out: tuple[str, ...] | list[str]) -> list[str]:
    """The warning for the likely secrets a bundle left out (none when nothing was)."""
    if not left_out:
        return []
    return [f"left out of the bundle as likely secrets: {', '.join(left_out)} "
            f"(a `!name` line in {bundles.IGNORE_FILE} sends one anyway)"]


async def planned(parts: Parts, spec_path: Path, policy_name: str) -> tuple[LoadedSpec, Policy, Plan]:
    """The spec checked and planned under the policy (raises FileError, PlanError)."""
    from trainmaster.jobs.yamlfile import FileError

    loaded = load_spec(spec_path)
    if problems := launch_problems(loaded):
        raise FileError(loaded.path, problems)
    if paths.overlaps_home(loaded.code_dir):
        raise FileError(loaded.path, [f"{loaded.path}: code: {loaded.code_dir} overlaps trainmaster's home "
                                      f"{paths.home()} (its state, job environments and secrets would be bundled); "
                                      "point code: at the job's own folder"])
    policy = load_policy(policy_name)
    result = await plan(parts, loaded.spec, policy)
    if result.chosen is None:
        raise PlanError(result)
    if "replay" in checks_for(policy, loaded.spec, result.chosen.offer):
        from trainmaster.verify.recipe_run import precision_refusal, processes_refusal

        if refusal := processes_refusal(loaded.spec):  # never dispatch a run its audit could not replay
            raise FileError(loaded.path, [f"{loaded.path}: resources.processes: {refusal}"])
        if refusal := precision_refusal(loaded.spec):
            raise FileError(loaded.path, [f"{loaded.path}: precision: {refusal}"])
    return loaded, policy, result


async def prepare(parts: Parts, spec_path: Path, policy_name: str = "default") -> Prepared:
    """Check, plan and hash without writing anything (raises FileError, PlanError, BundleError)."""
    loaded, policy, result = await planned(parts, spec_path, policy_name)
    info = await asyncio.to_thread(bundles.bundle_digest, loaded.code_dir, loaded.spec.canonical_json(),
                                   max_bytes=max_bundle(loaded.spec))
    from trainmaster.verify.output_kinds import dry_run_warnings

    offer = result.chosen.offer
    warnings = await asyncio.to_thread(dry_run_warnings, loaded.code_dir, trusted=offer.trusted, where=offer.backend,
                                       max_bundle_bytes=max_bundle(loaded.spec))
    warnings = [*left_out_warning(info.left_out), *warnings]
    return Prepared(loaded=loaded, policy=policy, plan=result, bundle=info, warnings=tuple(warnings),
                    budget=budget_refusal(parts, loaded.spec, policy, result),
                    start=start_preview(parts, loaded.spec, policy, offer))


async def record(parts: Parts, spec_path: Path, policy_name: str = "default", *, origin: dict | None = None) -> str:
    """Plan, bundle and record the job with its plan; returns its id. `origin` (who asked: a trigger's fire and its
    idempotency key) is kept in the job's first event."""
    shared_storage.check_database()
    loaded, policy, result = await planned(parts, spec_path, policy_name)
    info = await asyncio.to_thread(bundles.build_bundle, loaded.code_dir, loaded.spec.canonical_json(),
                                   paths.bundles_dir(), max_bytes=max_bundle(loaded.spec))
    await retried(shared_bundles.publish, info.sha256, parts.upload_progress)
    job_id = f"{loaded.spec.name}-{secrets.token_hex(4)}"
    parts.store.create_job(
        job_id=job_id, name=loaded.spec.name, workload=loaded.spec.workload, project=loaded.spec.project,
        spec_json=loaded.spec.model_dump_json(), spec_path=str(loaded.path), bundle_sha256=info.sha256,
        policy=policy_name, policy_json=policy.model_dump_json(),
        detail={"bundle_bytes": info.size, "files": info.files, "left_out": list(info.left_out),
                **({"origin": origin} if origin else {})},
    )
    parts.remember_policy(policy)
    record_plan(parts, job_id, result, seq=1)
    return job_id


def max_bundle(spec: JobSpec) -> int:
    return spec.limits.max_bundle_mb * 2**20

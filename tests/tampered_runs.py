"""An executor's run that goes on honestly from a state of its own choosing: S_j written as given, trained on from
it to S_n with the recipe's own steps, every segment written and committed. The shape every tampering case shares
(a swap, a freeze, a backdoor or a nudge at one boundary, then honest work) in the boundary checks' tests, the
referee's tests and bench_trust's detection figures."""

from __future__ import annotations

from pathlib import Path

from trainmaster.jobs.checkpoint import write_segment
from trainmaster.jobs.commitment import build_commitment
from trainmaster.jobs.decisions import DecisionLog, DecisionTrace
from trainmaster.jobs.execution import build_trainer, full_state, restore, run_step
from trainmaster.jobs.state import TrainState


def continue_from(ckpt: Path, recipe, cfg, state: TrainState, j: int, *, n: int, k: int, seed: int, job_id: str,
                  record_environment: bool = False):
    """Segments j..n under `ckpt` from `state` at boundary j, trained honestly on; the run's commitment."""
    trainer = build_trainer(recipe, cfg, seed)
    restore(trainer, state)
    current = full_state(trainer, recipe, cfg, seed, j * k).snapshot()
    for i in range(j, n + 1):
        log = DecisionLog()
        if i < n:
            for step in range(i * k, (i + 1) * k):
                run_step(trainer, seed, step, log)
        write_segment(ckpt, i, current, (log.trace if i < n else DecisionTrace()).to_tensors(),
                      job_id=job_id, recipe=recipe.name, step=i * k, k=k)
        if i < n:
            current = full_state(trainer, recipe, cfg, seed, (i + 1) * k).snapshot()
    return build_commitment(ckpt, job_id=job_id, bundle_sha256="0" * 64, n=n, k=k,
                            record_environment=record_environment)

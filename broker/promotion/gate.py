"""The promotion gate: the outcome check (verify/outcome.py) fed with the metrics of the model in production.

Each of the spec's `verification.thresholds` minimums must hold, and no thresholded metric may fall more than
10 % below the production version's (`≥ 0.90 ×` a positive score). With no production version yet, only the
minimums apply; a metric the check needs but the job never measured fails the gate."""

from __future__ import annotations

from collections.abc import Mapping


def gate_failures(metrics: Mapping[str, float], thresholds: Mapping[str, float],
                  production: Mapping[str, float] | None, production_version: str | None = None) -> list[str]:
    """Why the candidate may not replace production (empty: it may)."""
    from trainmaster.verify.errors import VerificationError
    from trainmaster.verify.outcome import regression_failures, threshold_failures

    try:
        below = threshold_failures(metrics, thresholds)
    except VerificationError as exc:
        return [str(exc)]
    against = f"against production version {production_version}: " if production_version else ""
    return below + [against + why for why in regression_failures(metrics, thresholds, production)]

"""The one effective configuration of each backend: backends.yaml, then the broker's defaults for what
the file leaves unset, then the policy's overrides of the fields the config model declares overridable.

What the broker dispatches with and what `trainmaster backends show` prints come from here, so the
value shown is the value used, with where it came from.
"""

from __future__ import annotations

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.config import Effective, effective
from trainmaster.broker import paths
from trainmaster.broker.policy import Policy


def configured(config: BackendConfig, policy: Policy | None) -> Effective:
    """A backend's backends.yaml section as jobs under `policy` use it (None: no policy's overrides)."""
    values = {f: getattr(policy, f) for f in policy.model_fields_set} if policy is not None else {}
    return effective(config, policy=policy.name if policy is not None else None, policy_values=values,
                     broker_defaults={"envs_dir": str(paths.envs_dir())})  # job environments, cached in the home

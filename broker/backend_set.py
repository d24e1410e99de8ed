"""The backends as the broker uses them: backends.yaml read in one place, each backend's effective configuration,
and one instance per configuration.

The effective configuration is backends.yaml, then the broker's defaults for what the file leaves unset, then the
policy's overrides of the fields the config model declares overridable (`configured`). What the broker dispatches
with and what `trainmaster backends show` prints come from here, so the value shown is the value used, with where
it came from. `envs_dir` is the one place the job environments' folder is resolved (backends.yaml's
`local.envs_dir`, else `envs/` in the home): the local backend builds them there, verification and
`trainmaster gc` read them there.

An instance is made per configuration and TAO/USD rate setting and bound once, when it is made, to the broker's
rate provider and upload progress: a cached instance is never changed afterwards, so two policies with different
power models or rates never share a local backend in a long-lived process.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainmaster.backends.base import Backend, BackendConfig, Progress
from trainmaster.backends.config import Effective, effective
from trainmaster.broker import paths

if TYPE_CHECKING:
    from trainmaster.broker.planning.policy import Policy
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.wallet.rates import RateProvider


def read_configs(config_dir: Path | None = None) -> dict[str, BackendConfig]:
    """backends.yaml from the user's config dir (or `config_dir`), each registered backend's section validated;
    FileError when invalid. The one place the file is read."""
    from trainmaster.backends.config import load_configs

    return load_configs(config_dir if config_dir is not None else paths.config_dir())


def configured(config: BackendConfig, policy: Policy | None) -> Effective:
    """A backend's backends.yaml section as jobs under `policy` use it (None: no policy's overrides)."""
    values = {f: getattr(policy, f) for f in policy.model_fields_set} if policy is not None else {}
    return effective(config, policy=policy.name if policy is not None else None, policy_values=values,
                     broker_defaults={"envs_dir": str(paths.envs_dir())})  # job environments, cached in the home


def envs_dir(configs: dict[str, BackendConfig] | None = None) -> Path:
    """Where job environments are built and found: backends.yaml's `local.envs_dir`, else `envs/` in the home.
    `configs`: backends.yaml as already read (else it is read)."""
    local = configured((configs if configs is not None else read_configs())["local"], None).config
    return Path(local.envs_dir)


class BackendSet:
    """The backends of one broker. `given` replaces registry backends by name (tests); `upload_progress` is drawn
    while a bundle is uploaded at submit (the CLI's transfer bar)."""

    def __init__(self, given: dict[str, Backend] | None = None, upload_progress: Progress | None = None):
        self.given = dict(given or {})
        self.upload_progress = upload_progress
        self._instances: dict[tuple[str, str, str], Backend] = {}
        self._rate_providers: dict[str, RateProvider | None] = {}
        self._configs: dict[str, BackendConfig] | None = None
        self._given_bound: dict[str, str] = {}

    def use_configs(self, configs: dict[str, BackendConfig]) -> None:
        """backends.yaml as the daemon last read and validated it (broker/daemon/config_watch.py), over the file."""
        self._configs = configs

    def configs(self) -> dict[str, BackendConfig]:
        """backends.yaml, read once per broker (FileError when invalid)."""
        if self._configs is None:
            self._configs = read_configs()
        return self._configs

    def envs_dir(self) -> Path:
        return envs_dir(self.configs())

    def effective_configs(self, policy: Policy) -> dict[str, BackendConfig]:
        """Each backend's configuration as jobs under `policy` use it (what `backend` builds them with)."""
        return {name: configured(config, policy).config for name, config in self.configs().items()}

    def rates(self, policy: Policy) -> RateProvider | None:
        """The TAO/USD rate provider of the policy (one per rate setting, kept for the process)."""
        from trainmaster.broker.planning.offer_request import provider_for

        key = policy.tao_rate.model_dump_json()
        if key not in self._rate_providers:
            self._rate_providers[key] = provider_for(policy)
        return self._rate_providers[key]

    def backend(self, name: str, policy: Policy) -> Backend:
        """The backend `name` with its effective configuration under `policy`, bound to the policy's rate provider."""
        if name in self.given:
            return self._bound_given(name, policy)
        from trainmaster.backends.registry import backend_class

        cls = backend_class(name)
        config = configured(self.configs()[name], policy).config
        key = (name, config.model_dump_json(), policy.tao_rate.model_dump_json())
        if key not in self._instances:
            made = cls(config)
            made.rates = self.rates(policy)  # the broker's rate provider, bound once
            made.progress = self.upload_progress  # the CLI's transfer bar, for a bundle uploaded at submit
            self._instances[key] = made
        return self._instances[key]

    def _bound_given(self, name: str, policy: Policy) -> Backend:
        """A backend a test gave, bound to the rate provider of the policy it is used under (again only when that
        changes) and to the broker's upload progress."""
        backend, key = self.given[name], policy.tao_rate.model_dump_json()
        if self._given_bound.get(name) != key:
            backend.rates = self.rates(policy)
            backend.progress = self.upload_progress
            self._given_bound[name] = key
        return backend

    def enabled(self, spec: JobSpec, policy: Policy) -> dict[str, Backend]:
        """The backends the job's class may run on under `policy` (the allowed ones, else its chain), by name."""
        from trainmaster.backends.registry import BACKENDS

        cls = policy.for_class(spec.workload)
        names = [n for n in (cls.constraints.allowed_backends or cls.chain) if n in BACKENDS or n in self.given]
        return {n: self.backend(n, policy) for n in names}

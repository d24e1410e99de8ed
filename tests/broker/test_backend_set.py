"""The backends as the broker uses them (broker/backend_set.py): one instance per configuration and rate setting,
bound once when made and never changed afterwards; backends.yaml read once; one `envs_dir`."""

from __future__ import annotations

import asyncio

from trainmaster.backends.power import PowerModel
from trainmaster.broker import paths
from trainmaster.broker.backend_set import BackendSet, envs_dir
from trainmaster.broker.planning.policy import load_policy


def _policy(**update):
    return load_policy("default").model_copy(update=update)


def test_a_policy_gets_the_same_instance_bound_once_to_its_rate_provider_and_the_upload_progress(tm_home):
    shown = []
    backends = BackendSet(upload_progress=lambda done, total: shown.append(done))
    plain, cheap = _policy(), _policy(power=PowerModel(usd_per_kwh_micro=1))
    first = backends.backend("local", plain)
    rates, progress = first.rates, first.progress
    assert progress is backends.upload_progress and rates is backends.rates(plain)
    other = backends.backend("local", cheap)  # another power model: another instance, the first one untouched
    assert other is not first and other.power.usd_per_kwh_micro == 1 and first.power.usd_per_kwh_micro == 150_000
    assert backends.backend("local", plain) is first and (first.rates, first.progress) == (rates, progress)


def test_a_rate_setting_of_its_own_gets_its_own_instance_with_its_own_provider(tm_home):
    backends = BackendSet()
    fixed = load_policy("default").model_copy(update={"tao_rate": load_policy("default").tao_rate.model_copy(
        update={"usd_per_tao": 400_000_000})})
    plain_one, fixed_one = backends.backend("local", _policy()), backends.backend("local", fixed)
    assert plain_one is not fixed_one
    assert plain_one.rates is None and asyncio.run(fixed_one.rates.current()).micro_usd_per_tao == 400_000_000


def test_backends_yaml_is_read_once_per_broker(tm_home):
    backends = BackendSet()
    assert backends.configs() is backends.configs()
    (paths.config_dir()).mkdir(parents=True)
    (paths.config_dir() / "backends.yaml").write_text("local:\n  cpus: 3\n")
    assert backends.configs()["local"].cpus is None  # as read when it was first asked for
    assert BackendSet().configs()["local"].cpus == 3


def test_the_job_environments_folder_is_the_homes_unless_backends_yaml_says(tm_home, tmp_path):
    assert envs_dir() == paths.home() / "envs"
    (paths.config_dir()).mkdir(parents=True)
    (paths.config_dir() / "backends.yaml").write_text(f"local:\n  envs_dir: {tmp_path / 'shared-envs'}\n")
    assert envs_dir() == tmp_path / "shared-envs"
    backends = BackendSet()
    assert backends.envs_dir() == tmp_path / "shared-envs"
    assert backends.backend("local", _policy()).config.envs_dir == str(tmp_path / "shared-envs")  # where it builds them

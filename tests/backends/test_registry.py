"""The backend registry is the one list of names: the policy, configs and classes agree with it."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from trainmaster.backends.base import BackendConfig
from trainmaster.backends.registry import BACKENDS, REGISTRY, UnknownBackend, backend_class
from trainmaster.broker.planning.policy import parse_step


def test_policy_names_are_the_registry_names():
    for name in REGISTRY:
        assert parse_step(name).backend == name
    with pytest.raises(ValueError, match="unknown backend 'awz'; did you mean 'aws'"):
        parse_step("awz")


def test_every_entry_resolves():
    for entry in REGISTRY.values():
        assert issubclass(entry.config_model(), BackendConfig)
        entry.config_model()()  # every field has a default: a missing backends.yaml is valid
        module = importlib.import_module(entry.checks)
        assert callable(module.found) and callable(module.check)


def test_implemented_backends_agree_with_their_class():
    """local and bittensor dispatch; each cloud does once its registry entry names its class."""
    assert list(BACKENDS) == [n for n, e in REGISTRY.items() if e.implemented]
    assert {"local", "bittensor"} <= set(BACKENDS)
    for name in BACKENDS:
        cls = backend_class(name)
        assert cls.name == name
        assert cls.config_model is REGISTRY[name].config_model()


def test_extra_sdk_trust_and_readiness_are_declared_only_in_the_registry():
    """One place for each fact: a backend class declares none of what its registry entry holds."""
    from trainmaster.backends.base import Backend

    for attribute in ("extra", "sdk", "trusted", "check", "checks"):
        assert not hasattr(Backend, attribute), attribute
        for name in BACKENDS:
            assert attribute not in vars(backend_class(name)), (name, attribute)


def test_planned_and_unknown_backends_have_no_class():
    planned = dataclasses.replace(REGISTRY["aws"], target=None)  # whether or not aws dispatches in this version
    assert not planned.implemented
    with pytest.raises(UnknownBackend, match="aws: dispatch is not available"):
        planned.backend_class()
    with pytest.raises(UnknownBackend, match="known: local, bittensor, aws, gcp, azure"):
        backend_class("nope")

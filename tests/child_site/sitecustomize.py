"""The test harness a wrapped CLI uses, applied again in each Python process that CLI starts.

tests/remote_executor/cli.py and tests/cli_with_chain.py patch the real CLI in their own process (a harness
backend registered, the chain's Substrate replaced), as do tests that run the CLI in-process. A read's background pass (broker/cli/background.py) is a
process of its own, so they put this folder and tests/ on PYTHONPATH and name their hooks in
TRAINMASTER_TEST_HOOKS (comma-separated; tests/child_hooks.py `hooked`), and Python runs this module at the start
of every such process:

- `remote_executor`: the harness registered (tests/remote_executor/cli.py `register`, its trust from
  TRAINMASTER_TEST_EXECUTOR_TRUSTED);
- `backend=NAME@module:Class`: the registry's entry NAME pointed at a harness backend (as tests do in their own
  process with monkeypatch);
- `chain=PATH`: the chain of tests/cli_with_chain.py kept in PATH.

Without TRAINMASTER_TEST_HOOKS it does nothing.
"""

from __future__ import annotations

import os


def _apply(hooks: list[str]) -> None:
    for hook in hooks:
        name, _, value = hook.partition("=")
        if name == "remote_executor":
            from remote_executor.cli import TRUSTED_ENV, register

            register(os.environ.get(TRUSTED_ENV) == "1")
        elif name == "backend":
            import dataclasses

            from trainmaster.backends import registry

            entry, _, target = value.partition("@")
            registry.REGISTRY[entry] = dataclasses.replace(registry.REGISTRY[entry], target=target)
            registry.BACKENDS[entry] = target
        elif name == "chain":
            from cli_with_chain import use_chain

            use_chain(value)


try:
    _apply([h for h in os.environ.get("TRAINMASTER_TEST_HOOKS", "").split(",") if h])
except ImportError:  # a process without tests/ or trainmaster on its path (a job's own interpreter): none apply
    pass

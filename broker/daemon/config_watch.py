"""The daemon's configuration follows its files: `backends.yaml`, `triggers.yaml`, `registry.yaml` and the user's
policies (`<config>/policies/*.yaml`).

At start every file is read and validated; one that does not validate fails the start with its `file:line`
messages (`daemon start` prints them). While the daemon runs, `Configuration.changed()` looks at the files' sizes,
times and inodes every `WATCH_S` seconds (and `reload()` runs at once on SIGHUP or `trainmaster daemon reload`):
when anything changed, everything is read and validated again **before** any of it is used. A set that validates
replaces the one in force (the brokers get the new `backends.yaml`, the trigger engine is rebuilt, the user's
policies are the new ones); one that does not leaves the previous set in force, and its problems are reported in
`/v1/health` and `daemon status` until the files are fixed.

The registry is read by each promotion as it happens (a broken `registry.yaml` leaves promotions pending, as a
registry that is down does); here it is validated so its problems are reported too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("trainmaster.daemon")

WATCH_S = 2.0


@dataclass
class Loaded:
    """One validated set of configuration files."""

    backends: dict[str, Any]
    triggers: list
    policies: dict[str, Any]
    registry: Any = None


@dataclass
class Configuration:
    """The configuration in force, and why the files on disk are not (when they are not)."""

    config_dir: Path
    in_force: Loaded | None = None
    problems: list[str] = field(default_factory=list)
    reloads: int = 0
    _seen: tuple = ()

    def files(self) -> list[Path]:
        from trainmaster.backends.config import FILE_NAME as BACKENDS
        from trainmaster.broker.daemon.triggers.model import FILE_NAME as TRIGGERS
        from trainmaster.broker.promotion.config import FILE_NAME as REGISTRY

        found = [self.config_dir / name for name in (BACKENDS, TRIGGERS, REGISTRY)]
        try:
            found += sorted(p for p in (self.config_dir / "policies").iterdir() if p.suffix == ".yaml")
        except OSError:
            pass
        return found

    def fingerprint(self) -> tuple:
        """What the files are now: each one's size, modification time and inode (absent: None)."""
        seen = []
        for path in self.files():
            try:
                info = os.stat(path)
                seen.append((str(path), info.st_size, info.st_mtime_ns, info.st_ino))
            except OSError:
                seen.append((str(path), None))
        return tuple(seen)

    def load(self) -> Loaded:
        """Every file read and validated; `FileError` with every problem (each `file:line: field: why`)."""
        from trainmaster.backends.config import load_configs
        from trainmaster.broker.daemon.triggers.model import load_triggers
        from trainmaster.broker.policy import Policy
        from trainmaster.broker.promotion.config import load_registry
        from trainmaster.jobs.yamlfile import FileError, load_model

        problems: list[str] = []
        loaded = Loaded(backends={}, triggers=[], policies={})

        def attempt(fn):
            try:
                return fn()
            except FileError as exc:
                problems.extend(exc.problems)
            except OSError as exc:
                problems.append(str(exc))
            return None

        self._seen = self.fingerprint()
        loaded.backends = attempt(lambda: load_configs(self.config_dir)) or {}
        loaded.triggers = attempt(load_triggers) or []
        loaded.registry = attempt(load_registry)
        for path in self.files()[3:]:
            policy = attempt(lambda p=path: load_model(p, Policy))
            if policy is not None:
                loaded.policies[path.stem] = policy
        if problems:
            raise FileError(self.config_dir, problems)
        return loaded

    def start(self) -> Loaded:
        """The first load (raising `FileError` when a file is bad: the daemon does not start)."""
        self.in_force = self.load()
        self._use_policies()
        return self.in_force

    def changed(self) -> bool:
        return self.fingerprint() != self._seen

    def reload(self) -> bool:
        """Read and validate the files again; whether a new set is now in force (False: the old one stays, and
        `problems` says why)."""
        from trainmaster.jobs.yamlfile import FileError

        try:
            loaded = self.load()
        except FileError as exc:
            if exc.problems != self.problems:
                log.error("configuration: the files do not validate; the previous configuration stays in force:\n%s",
                          "\n".join(exc.problems))
            self.problems = list(exc.problems)
            return False
        self.in_force, self.problems = loaded, []
        self.reloads += 1
        self._use_policies()
        log.info("configuration reloaded (%d trigger(s), %d policy file(s))", len(loaded.triggers),
                 len(loaded.policies))
        return True

    def status(self) -> list[str]:
        """Problems as `/v1/health` reports them."""
        if not self.problems:
            return []
        return ["configuration: the files below do not validate, the previous configuration stays in force: "
                + "; ".join(self.problems)]

    def _use_policies(self) -> None:
        from trainmaster.broker.policy import keep_in_force

        keep_in_force(self.in_force.policies)

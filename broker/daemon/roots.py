"""The folders a request to the daemon may name files in (`daemon start --root DIR`, repeatable).

A submit names its spec (and maybe a policy file) by a path on the daemon's machine. The daemon reads such a path
only when it is absolute (a relative one would resolve against the daemon's own folder, never the caller's: the
CLI sends absolute paths) and, links resolved, lies under one of its roots; the spec's code folder and local data
must lie there too. By default the roots are the home folder of the user the daemon runs as and the system's
temporary folder. The file itself is then read bounded (jobs/userfile.py: a regular file, at most 1 MiB), so no
request can block the API on a FIFO or fill the daemon's memory from `/dev/zero`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainmaster.jobs.yamlfile import FileError


def default_roots() -> list[Path]:
    """The home folder of the daemon's user and the system's temporary folder."""
    return [Path(os.path.realpath(Path.home())), Path(os.path.realpath(tempfile.gettempdir()))]


class Roots:
    """The folders requests may name files under."""

    def __init__(self, roots: list[str | Path] | None = None):
        self.roots = [Path(os.path.realpath(r)) for r in roots] if roots else default_roots()

    def __str__(self) -> str:
        return ", ".join(map(str, self.roots))

    def contains(self, path: Path | str) -> bool:
        real = Path(os.path.realpath(path))
        return any(real == root or root in real.parents for root in self.roots)

    def checked(self, field: str, value: str) -> Path:
        """`value` as an absolute path under a root; a `FileError` (400) naming the field and why otherwise."""
        if not value or "\0" in value:
            raise FileError(field, [f"{field}: a path is required"])
        path = Path(value)
        if not path.is_absolute():
            raise FileError(value, [f"{field}: {value}: give an absolute path (a relative one would resolve in the "
                                    "daemon's folder, not yours; the CLI sends absolute paths)"])
        if not self.contains(path):
            raise FileError(value, [f"{field}: {value} is outside the folders this daemon reads ({self}); "
                                    "start it with --root to add one"])
        return path

    def check_spec(self, spec_path: Path) -> None:
        """The spec's code folder and local data under a root too (the spec itself read bounded)."""
        from trainmaster.jobs.spec import load_spec

        loaded = load_spec(spec_path)
        outside = [str(loaded.code_dir)] if not self.contains(loaded.code_dir) else []
        outside += [item.source for item in loaded.spec.data
                    if not item.is_remote and not self.contains(spec_path.parent / item.source)]
        if outside:
            raise FileError(spec_path, [f"{spec_path}: {', '.join(outside)}: outside the folders this daemon reads "
                                        f"({self}); start it with --root to add one"])

"""`./dev demo`: submit the shipped demo job on the embedded default (local backend, SQLite) and wait."""

from __future__ import annotations

import sys
from importlib import resources

from trainmaster.broker.cli import app


def main() -> None:
    example = resources.files("trainmaster.configs") / "examples" / "demo" / "job.yaml"
    app(["submit", str(example), "--wait", *sys.argv[1:]])


if __name__ == "__main__":
    main()

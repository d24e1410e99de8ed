"""What the shared-storage tests share: a job that writes two outputs, one that fails its first run (so `resume`
dispatches it again), and the CLI run with a storage setting (tests/cli_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import tm

TWO_OUTPUTS = """\
import os, pathlib
out = pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'])
(out / 'sub').mkdir()
(out / 'sub' / 'weights.bin').write_bytes(os.urandom(3000))
(out / 'result.txt').write_text('ok')
"""

FAILS_FIRST = """\
import os, pathlib, sys
mark = pathlib.Path(os.environ['MARK'])
if not mark.exists():
    mark.write_text('ran once')
    sys.exit(3)
pathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'result.txt').write_text('second time')
"""


def cli(*args: str, home: Path, storage: str | None, **env: str):
    """The CLI on `home` with TRAINMASTER_SHARED_STORAGE set to `storage` (unset for None)."""
    extra = {"TRAINMASTER_SHARED_STORAGE": storage or "", **env}
    return tm(*args, home=home, extra_env=extra)


def submitted(spec: Path, home: Path, storage: str | None) -> dict:
    """`submit --wait --json`: the job as it ended."""
    done = cli("submit", str(spec), "--wait", "--json", home=home, storage=storage)
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

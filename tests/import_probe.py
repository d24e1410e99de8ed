"""Which modules a CLI command imports: the command run in a fresh interpreter (`imported`), and what of `watched`
is in sys.modules after it ran (the commands' import budget: tests of lazy imports)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("trainmaster.broker.service", "trainmaster.broker.planning.planner", "trainmaster.broker.planning.policy",
         "trainmaster.jobs.spec", "trainmaster.backends.base", "trainmaster.jobs.bundle", "trainmaster.wallet.ledger",
         "asyncio", "numpy", "torch", "psycopg")
PROBE = """\
import json, sys
watched = json.loads(sys.argv[2])
sys.argv = ["trainmaster", *json.loads(sys.argv[1])]
from trainmaster.broker.cli import main
try:
    main()
except SystemExit:
    pass
print("IMPORTED", json.dumps(sorted(name for name in watched if name in sys.modules)), file=sys.stderr)
"""


def imported(args: list[str], watched=HEAVY) -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args), json.dumps(watched)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    line = next((line for line in done.stderr.splitlines() if line.startswith("IMPORTED ")), None)
    assert line is not None, done.stderr
    return json.loads(line.removeprefix("IMPORTED ")), done.stdout

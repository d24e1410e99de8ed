"""A container's own filesystem view for the SageMaker runner: /opt/ml and /etc/hosts of its instance, for real.

SageMaker puts everything at fixed paths (/opt/ml/input/config/resourceconfig.json, /opt/ml/input/data/<channel>,
/opt/ml/checkpoints, /opt/ml/model, /opt/ml/output) and names its instances algo-1, algo-2, … So each instance
the runner starts runs in a mount namespace of its own (`unshare --user --map-root-user --mount`, no privilege
needed): a tmpfs over /opt keeps the host's /opt entries bound back in place and adds `ml`, bound to that
instance's folder; /etc/hosts is bound to a file resolving the job's hosts to 127.0.0.1. The launcher is the
one every container runs, reading the real paths: nothing is relocated. The process keeps the PID `unshare`
started with (no fork), so signals and exit codes are the container's own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SCRIPT = r"""
set -e
orig=$1; ml=$2; hosts=$3; shift 3
mount --bind /opt "$orig"
mount -t tmpfs tmpfs /opt
for entry in "$orig"/* "$orig"/.[!.]*; do
  [ -e "$entry" ] || continue
  name=${entry##*/}
  if [ -d "$entry" ]; then mkdir "/opt/$name"; else : > "/opt/$name"; fi
  mount --bind "$entry" "/opt/$name"
done
mkdir /opt/ml
mount --bind "$ml" /opt/ml
mount --bind "$hosts" /etc/hosts
exec "$@"
"""


def unshare() -> str:
    found = shutil.which("unshare")
    if found is None:
        raise RuntimeError("unshare (util-linux) is needed to give each SageMaker container its own /opt/ml")
    return found


def in_instance(argv: list[str], home: Path, hosts: list[str]) -> list[str]:
    """`argv` run with `home` as /opt/ml and `hosts` resolving to 127.0.0.1 (files made under `home`'s parent)."""
    side = home.parent / f".{home.name}-ns"
    (side / "opt").mkdir(parents=True, exist_ok=True)
    hosts_file = side / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {host}\n" for host in hosts))
    return [unshare(), "--user", "--map-root-user", "--mount", "sh", "-c", SCRIPT, "sagemaker-instance",
            str(side / "opt"), str(home), str(hosts_file), *argv]

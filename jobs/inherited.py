"""What a job inherits from the environment of the process that starts it (the CLI, or the daemon): an explicit
allowlist, never the broker's secrets.

A job runs code the broker does not vouch for, and the broker's environment holds what the broker alone may use:
`TRAINMASTER_DATABASE_URL` (the database's password), API tokens, wallet passwords, cloud credentials. So a local
job starts from nothing but the names below (docs/runtime.md, "What a job inherits"), then gets the variables
trainmaster sets (jobs/environment.py) and its spec's own `env:`, which win:

- `INHERITED`: the system's basics (`PATH`, `HOME`, `USER`, `LANG`, `TZ`, `TMPDIR`, …), the Python and virtualenv
  settings, the CA bundles, the proxies, and the caches of the libraries training uses;
- `INHERITED_PREFIXES`: whole families that tune the machine (`LC_*`, `CUDA_*`, `NCCL_*`, `OMP_*`, `PIP_*`, …);
- `extra`: what `backends.yaml` adds (`local: inherit_env: [NAME, PREFIX*]`).

Whatever the lists say, a name that looks like a secret (`NEVER`, `SECRET_WORDS`) is never inherited: every
`TRAINMASTER_*` variable (the job's own are set afresh), and any name holding TOKEN, SECRET, PASSWORD, PASSPHRASE,
CREDENTIAL or ending in _KEY. Pass a job what it needs through its spec's `env:`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping

INHERITED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP",
    "HOSTNAME", "DISPLAY",
    "PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONWARNINGS",
    "PYTHONIOENCODING", "PYTHONUTF8", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV", "CONDA_EXE", "PYENV_ROOT",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_RUNTIME_DIR",
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_CACHE",
    "TRANSFORMERS_OFFLINE", "WANDB_MODE", "WANDB_DIR", "MPLBACKEND", "MPLCONFIGDIR",
})
"""Variables a job inherits by name."""

INHERITED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH_",
                      "PYTORCH_", "CUBLAS_", "CUDNN_", "TF_CPP_", "XLA_FLAGS", "PIP_", "UV_", "GYM_", "MUJOCO_")
"""Families of variables a job inherits (they tune the machine, the libraries and package installs)."""

NEVER = ("TRAINMASTER_",)
"""Prefixes never inherited: trainmaster's own settings (its database URL among them)."""
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "PRIVATE")
"""A name holding any of these is never inherited, nor one ending in `_KEY` (an API key)."""


def is_secret(name: str) -> bool:
    upper = name.upper()
    return upper.startswith(NEVER) or any(w in upper for w in SECRET_WORDS) or upper.endswith("_KEY")


def allowed(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether a job inherits the variable `name` (`extra`: names or `PREFIX*` patterns added by the config)."""
    if is_secret(name):
        return False
    return (name in INHERITED or name.startswith(INHERITED_PREFIXES)
            or any(fnmatch.fnmatchcase(name, pattern) for pattern in extra))


def inherited(environ: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """The part of `environ` a job inherits."""
    extra = tuple(extra)
    return {name: value for name, value in environ.items() if allowed(name, extra)}

"""The job name each managed service gets for an attempt: derived from the attempt id alone, so a submit repeated
after a crash (or a retry of the same attempt) finds the job it created, and within every service's rules.

The rules (each service's published schema):

* SageMaker `TrainingJobName`: 1-63 characters, `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}` (letters, digits and inner
  hyphens: no dot, no underscore);
* Azure ML job name (the ARM resource name): `^[a-zA-Z0-9][a-zA-Z0-9\\-_]{0,254}$`;
* Vertex AI `CustomJob.display_name`: at most 128 UTF-8 characters.

An attempt id (`<job name>-<8 hex>.<n>`) holds a dot and may be long, so the name is `tm-` + the id with every run
of other characters than letters and digits made one hyphen, cut to fit, + `-` + 8 hex digits of the id's
sha256: two ids that read alike once cleaned (`a.b` and `a-b`) or once cut still get two names. The result fits
all three services, so one function serves them.
"""

from __future__ import annotations

import hashlib
import re

MAX_LENGTH = 63
"""SageMaker's limit, the tightest of the three."""
PREFIX = "tm-"
DIGEST = 8
SAGEMAKER = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}")
AZURE_ML = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9\-_]{0,254}")
VERTEX_MAX = 128


def job_name(attempt_id: str) -> str:
    """The services' name for the attempt: stable (the same id always gives the same name) and unique per id."""
    digest = hashlib.sha256(attempt_id.encode()).hexdigest()[:DIGEST]
    room = MAX_LENGTH - len(PREFIX) - 1 - DIGEST
    slug = re.sub(r"[^a-z0-9]+", "-", attempt_id.lower())[:room].strip("-")
    return f"{PREFIX}{slug}-{digest}" if slug else f"{PREFIX}{digest}"


def fits(name: str) -> bool:
    """Whether `name` is a valid job name on SageMaker, Azure ML and Vertex AI alike."""
    return (len(name) <= MAX_LENGTH and SAGEMAKER.fullmatch(name) is not None
            and AZURE_ML.fullmatch(name) is not None and len(name) <= VERTEX_MAX)

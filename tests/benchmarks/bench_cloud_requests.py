"""Every request the cloud tests send, checked against the services' own rules (#31): the count per service and the
violations (0 expected).

Runs the cloud tests under pytest with TM_REQUESTS_CHECKED naming a report file: each fake checks every request it
receives (SageMaker and S3 against botocore's service model, Vertex AI against the aiplatform_v1 protos and the
API's documented limits, Cloud Storage's naming rules, Azure ML against its REST spec: tests/clouds/rules_*.py),
and the tests' session writes its tally there (tests/conftest.py). Requests a test sends on purpose to see the
fake refuse them are counted, and kept apart from the violations (clouds.checked.expected).

Run: python tests/benchmarks/bench_cloud_requests.py   (the cloud tests, about 25 minutes on 2 cores; smoke: two
of the SageMaker service's own tests, one whose requests all keep the rules and one whose refused requests are
counted apart, so the tally's both sides are exercised; the whole file runs in the suite anyway)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(Path(__file__).parent)]
from _common import print_figures  # noqa: E402

CLOUD_TESTS = ["backends/aws/test_aws_s3.py", "backends/aws/test_aws_sagemaker.py", "backends/aws/test_aws_check.py",
               "backends/aws/test_aws_cli.py", "backends/gcp/test_gcp_store.py", "backends/gcp/test_gcp_vertex.py",
               "backends/gcp/test_gcp_backend.py", "backends/gcp/test_gcp_cli.py", "backends/azure/test_azure_blob.py",
               "backends/azure/test_azure_ml.py", "backends/azure/test_azure_backend.py",
               "backends/azure/test_azure_cli.py"]
"""The cloud tests, under tests/ (they mirror the package's folders)."""
SMOKE = ["backends/aws/test_aws_sagemaker.py::test_what_the_backend_sends_keeps_every_rule",
         "backends/aws/test_aws_sagemaker.py::test_the_fake_refuses_what_sagemaker_refuses"]


def run(smoke: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-requests-") as folder:
        report = Path(folder) / "checked.json"
        files = [str(TESTS / name) for name in (SMOKE if smoke else CLOUD_TESTS)]
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--tb=short",
                               "-rf", *files],
                              cwd=TESTS.parent, capture_output=True, text=True, timeout=3600,
                              env={**os.environ, "TM_REQUESTS_CHECKED": str(report)})
        found = json.loads(report.read_text()) if report.is_file() else {"counts": {}, "violations": []}
    if done.returncode != 0:
        raise RuntimeError(f"the cloud tests failed:\n{done.stdout[-20000:]}")
    figures: dict[str, float] = {f"{service}_requests_checked": count for service, count in sorted(found["counts"].items())}
    figures["requests_checked"] = sum(found["counts"].values())
    figures["violations"] = len(found["violations"])
    if not figures["requests_checked"]:
        raise RuntimeError(f"the cloud tests passed and no request was checked (no tally in {report.name}):\n"
                           f"{done.stdout[-5000:]}")
    print_figures("requests checked against the services' own rules, over " + ("two SageMaker tests" if smoke else
                  f"{len(files)} cloud test files"), figures, {"violations": "0"})
    for line in found["violations"][:20]:
        print("  violation:", line)
    return figures


if __name__ == "__main__":
    run(smoke="--smoke" in sys.argv)

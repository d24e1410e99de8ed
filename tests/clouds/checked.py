"""The tally of every request the cloud fakes checked against their service's own published rules.

Each fake (moto's SageMaker and S3, FakeVertex and the storage emulator's requests, FakeAzureML) checks every
request it receives (`rules_aws.py`, `rules_vertex.py`, `rules_azureml.py`), answers a violation as its service
would (a 400 with the rule broken), and records it here. The fixtures of the cloud tests fail a test that sent
one (`assert_clean`), so a request the real service would refuse cannot pass. At the end of a session the counts
per service are written to the file TM_REQUESTS_CHECKED names, if set (tests/benchmarks/bench_cloud_requests.py
reads them).
"""

from __future__ import annotations

import collections
import json
import os
import threading

REPORT = "TM_REQUESTS_CHECKED"

_lock = threading.Lock()
counts: collections.Counter = collections.Counter()
violations: list[str] = []


def record(service: str, operation: str, problems: list[str]) -> None:
    """One request of `service` checked; its problems (empty when it keeps every rule)."""
    with _lock:
        counts[service] += 1
        violations.extend(f"{service} {operation}: {problem}" for problem in problems)


class expected:
    """`with checked.expected() as refused:` — violations recorded inside are the test's point (it sends a request
    the service refuses, to see the fake refuse it): kept in `refused`, not failing the test."""

    def __enter__(self) -> list[str]:
        self.start, self.refused = mark(), []
        return self.refused

    def __exit__(self, *_exc) -> None:
        with _lock:
            self.refused.extend(violations[self.start:])
            del violations[self.start:]


def mark() -> int:
    """Where the violations stand now (a test's start)."""
    with _lock:
        return len(violations)


def since(start: int) -> list[str]:
    with _lock:
        return violations[start:]


def assert_clean(start: int) -> None:
    found = since(start)
    assert not found, "requests the real service would refuse:\n" + "\n".join(found[:20])


def write_report() -> None:
    """Add this process's tally to the report file TM_REQUESTS_CHECKED names (several pytest workers may share it)."""
    import fcntl

    path = os.environ.get(REPORT)
    if not path:
        return
    with _lock:
        data = {"counts": dict(counts), "violations": list(violations)}
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read()
        previous = json.loads(text) if text.strip() else {"counts": {}, "violations": []}
        for service, count in data["counts"].items():
            previous["counts"][service] = previous["counts"].get(service, 0) + count
        previous["violations"] += data["violations"]
        handle.seek(0)
        handle.truncate()
        json.dump(previous, handle)

"""The daemon's parts together, as a user meets them: the trigger engine runs inside the daemon (triggers.yaml),
a trigger fired through the API submits a job the reconciler takes to `accepted`, and /metrics and the dashboard
are served by the same process behind the same token."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from daemon_support import get, kill, start, wait_for
from prometheus_client.parser import text_string_to_metric_families

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


def request(address: str, path: str, *, token: str | None = None, method: str = "GET", cookie: str | None = None):
    headers = {**({"Authorization": f"Bearer {token}"} if token else {}),
               **({"Cookie": f"trainmaster_token={cookie}"} if cookie else {})}
    req = urllib.request.Request(address + path, method=method, headers=headers, data=b"" if method == "POST" else None)
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=20) as answer:
            return answer.status, answer.headers, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read().decode()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.fixture
def daemon(tm_home, job_factory):
    spec = job_factory(TRAIN)
    config = tm_home / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "triggers.yaml").write_text(
        f"triggers:\n  - name: by-hand\n    spec: {spec}\n    manual: true\n"
        f"  - name: nightly\n    spec: {spec}\n    schedule: '0 1 * * *'\n")
    state = start(tm_home)
    yield state
    kill(state["pid"])


def test_a_trigger_fired_through_the_api_runs_and_shows_in_metrics_and_the_dashboard(daemon, tm_home):
    token, address = (tm_home / "daemon" / "token").read_text().strip(), daemon["address"]
    status, listed = get(address, "/v1/triggers", token=token)
    assert status == 200 and [t["name"] for t in listed["triggers"]] == ["by-hand", "nightly"]
    assert request(address, "/v1/triggers/by-hand/fire", method="POST")[0] == 401  # the token, always
    status, _, body = request(address, "/v1/triggers/by-hand/fire", token=token, method="POST")
    assert status == 200, body
    job_id = json.loads(body)["job"]
    wait_for(lambda: get(address, f"/v1/jobs/{job_id}", token=token)[1].get("state") == "accepted",
             what="the fired job accepted")
    status, _, body = request(address, "/v1/triggers/nope/fire", token=token, method="POST")
    assert status == 409 and "no trigger 'nope'" in body

    assert request(address, "/metrics")[0] == 401
    status, _, text = request(address, "/metrics", token=token)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("trainmaster_jobs", (("state", "accepted"),))] == 1
    assert ("trainmaster_trigger_lag_seconds", (("trigger", "nightly"),)) in samples  # the engine's lag, wired

    status, headers, _ = request(address, f"/dashboard?token={token}")
    assert status == 303 and "trainmaster_token=" in headers.get("Set-Cookie", "")
    assert request(address, "/dashboard?token=wrong")[0] == 401
    status, _, page = request(address, "/dashboard", cookie=token)
    assert status == 200 and "<html" in page.lower()
    status, _, jobs = request(address, "/dashboard/api/jobs", cookie=token)
    assert status == 200 and job_id in jobs

"""A webhook's path and query hold its token: no message shows more of a URL than scheme, host and port."""

from __future__ import annotations

import socket

import pytest
from cli_run import tm

from trainmaster.wallet.alerts import redact_urls

TRAIN = "import os, pathlib\npathlib.Path(os.environ['TRAINMASTER_OUTPUT_DIR'], 'out.txt').write_text('ok')\n"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("text, shown", [
    ("hook http://127.0.0.1:9/hooks/T0KEN?key=abc failed", "hook http://127.0.0.1:9/… failed"),
    ("url='https://user:pw@hooks.example.com/services/T/B/x#frag'", "url='https://hooks.example.com/…'"),
    ("at http://[::1]:8080/t and https://h.example/", "at http://[::1]:8080/… and https://h.example"),
    ("no url here", "no url here"),
])
def test_redact_urls_keeps_scheme_host_and_port(text, shown):
    assert redact_urls(text) == shown


def test_a_failed_webhook_is_reported_without_its_token(job_factory, tmp_path):
    port = closed_port()
    policy = tmp_path / "leaky.yaml"
    policy.write_text(f"name: leaky\nbudgets:\n  - name: tiny\n    cap: 0.000001\n    hard: false\n"
                      f"    alert_at_percent: [1]\n    webhook: http://127.0.0.1:{port}/hooks/T0KEN-SECRET/x?key=abc123\n")
    spec = job_factory(TRAIN)
    out = tm("submit", str(spec), "--policy", str(policy), "--wait", home=tmp_path / "home")
    assert out.returncode == 0, out.stdout + out.stderr
    shown = out.stdout + out.stderr
    assert f"budget alert webhook http://127.0.0.1:{port}/… failed" in shown
    assert "T0KEN-SECRET" not in shown and "abc123" not in shown

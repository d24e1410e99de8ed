"""The dashboard's routes over HTTP (no browser): the token sign-in redirect, the page's escaping and
headers, its JSON, and the curves read from a job's fetched `metrics.jsonl`."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


from observe_support import HOSTILE
from trainmaster.broker.daemon.web import charts, curves


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url: str) -> tuple[int, dict, str]:
    try:
        with urllib.request.build_opener(NoRedirect).open(url) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_a_token_in_the_address_becomes_an_httponly_strict_cookie_and_leaves_the_address(served):
    status, headers, _ = get(served.url + "/dashboard?token=s3cret-Token_1")
    assert status == 303 and headers["Location"] == "/dashboard"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith("trainmaster_token=s3cret-Token_1;")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert headers["Cache-Control"] == "no-store" and headers["Referrer-Policy"] == "no-referrer"


def test_the_page_escapes_names_and_reasons_and_lets_only_its_own_script_run(served):
    status, headers, html = get(served.url + "/dashboard")
    assert status == 200
    assert HOSTILE not in html and "<img src=x" not in html
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in html
    nonce = headers["Content-Security-Policy"].split("'nonce-")[1].split("'")[0]
    assert html.count("<script") == 1 and f'<script nonce="{nonce}">' in html
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert get(served.url + "/dashboard")[1]["Content-Security-Policy"] != headers["Content-Security-Policy"]


def test_the_page_shows_jobs_budgets_curves_and_verdicts(served):
    html = get(served.url + "/dashboard")[2]
    for text in ('data-job="a"', 'data-job="e"', "bittensor", "$1.50", "month: all spend", "$3.75", "$10.00",
                 "<title>loss</title>", "<title>local</title>", "replayed_steps", "accepted", "rejected"):
        assert text in html, text


def test_the_jobs_json_has_each_job_s_live_state(served):
    jobs = {j["id"]: j for j in json.loads(get(served.url + "/dashboard/api/jobs")[2])["jobs"]}
    assert jobs["d"]["state"] == "running" and jobs["d"]["backend"] == "aws"
    served.filler.accept("d", "d.1", 1_000_000)
    jobs = {j["id"]: j for j in json.loads(get(served.url + "/dashboard/api/jobs")[2])["jobs"]}
    assert jobs["d"]["state"] == "accepted" and jobs["d"]["cost"] == "$1.00" and jobs["c"]["name"] == HOSTILE


def test_spend_and_verdicts_json(served):
    spend = json.loads(get(served.url + "/dashboard/api/spend")[2])
    assert spend["by_backend"] == {"bittensor": {"micro_usd": 250_000, "rao": 5_000},
                                   "local": {"micro_usd": 1_500_000, "rao": 0}}
    assert spend["budgets"] == [{"label": "month: all spend", "used": "$3.75", "cap": "$10.00", "percent": 38}]
    verdicts = json.loads(get(served.url + "/dashboard/api/verdicts")[2])["verdicts"]
    rejected = next(v for v in verdicts if v["job_id"] == "c")
    assert rejected["outcome"] == "rejected" and rejected["reasons"] == [HOSTILE]
    assert rejected["evidence"] == {"note": HOSTILE}


def test_a_job_s_metrics_and_an_unknown_job(served):
    status, _, body = get(served.url + "/dashboard/api/jobs/a/metrics")
    series = json.loads(body)["series"]
    assert status == 200 and series["loss"][0] == [1.0, 2.0] and len(series["loss"]) == 50 and "lr" in series
    assert json.loads(get(served.url + "/dashboard/api/jobs/d/metrics")[2])["series"] == {}  # nothing fetched
    assert get(served.url + "/dashboard/api/jobs/nope/metrics")[0] == 404
    assert get(served.url + "/dashboard/api/jobs/..%2Fa/metrics")[0] == 404


def test_curves_skip_torn_and_foreign_lines_and_prefer_loss_and_return(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([
        json.dumps({"step": 1, "zeta": 1, "episode_return": 3.5, "loss": 0.9}),
        json.dumps({"step": 2, "zeta": 2, "episode_return": "nan", "loss": 0.5, "alpha": True}),
        "[1, 2]", json.dumps({"loss": 4}), json.dumps({"step": "3", "loss": 1}),
        json.dumps({"step": 4, "zeta": 3, "aa": 1, "loss": 0.1}), '{"step": 5, "loss": 0.0',
    ]))
    found = curves.read_curves(path)
    assert list(found) == ["episode_return", "loss", "aa"]  # loss/return first, at most 3, then by name
    assert found["loss"] == [(1.0, 0.9), (2.0, 0.5), (4.0, 0.1)] and found["episode_return"] == [(1.0, 3.5)]
    assert curves.metrics_file(tmp_path, "..") is None and curves.metrics_file(tmp_path, "a/b") is None


def test_a_long_curve_is_thinned_to_its_first_and_last_points(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": s}) + "\n" for s in range(1, 5001)))
    loss = curves.read_curves(path)["loss"]
    assert len(loss) == curves.MOST_POINTS and loss[0] == (1.0, 1.0) and loss[-1] == (5000.0, 5000.0)


def test_a_chart_maps_data_into_its_box_and_survives_a_flat_series():
    chart = charts.line_chart("t", {"s": [(0, 0), (10, 5)]}, {"cap": 10}, x_label="step", y_label="USD")
    left, top, right, bottom = chart.plot
    points = [tuple(map(float, p.split(","))) for p in chart.lines[0].points.split()]
    first, last = points[0], points[-1]
    assert first == (left, bottom)
    assert last == (right, (top + bottom) / 2)
    assert chart.lines[1].dashed and chart.lines[1].points.endswith(f",{top:.1f}")
    assert (chart.x_label, chart.y_label) == ("step", "USD")
    assert [t.label for t in chart.y_ticks] == ["0", "5", "10"]
    assert [t.label for t in chart.x_ticks] == ["0", "5", "10"]
    flat = charts.line_chart("flat", {"s": [(3, 7)]})
    left, top, right, bottom = flat.plot
    assert flat.lines[0].points == f"{(left + right) / 2:.1f},{top:.1f}"  # money and counts start at 0


def test_a_cap_that_dwarfs_the_spend_is_said_below_the_chart_not_drawn():
    chart = charts.line_chart("spend", {"local": [(0, 0.0), (10, 2.5)]}, {"cap: monthly": 1000.0})
    assert [line.name for line in chart.lines] == ["local"]  # the series fills the chart
    assert chart.y_max == 2.5 and chart.off_chart == ["cap: monthly: 1,000.00, far above the chart (0.25% of it reached)"]
    near = charts.line_chart("spend", {"local": [(0, 0.0), (10, 2.5)]}, {"cap: monthly": 5.0})
    assert [line.name for line in near.lines] == ["local", "cap: monthly"] and not near.off_chart

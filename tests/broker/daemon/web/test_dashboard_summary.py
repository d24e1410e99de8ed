"""#33 §8, the dashboard in headless Chromium (tests/browser_support.py): a summary at the top
(running, queued, failed today, this month's spend against the budget), the jobs' table a page at a time (the spend
and curves within reach, not 2,500 px down), labelled chart axes, a spend chart that is not a flat line when the
budget's cap dwarfs the spend, and no backend shown for a job that never ran."""

from __future__ import annotations

import pytest

from browser_support import browser, page  # noqa: F401  (the Chromium fixtures)
from observe_support import Filler, serve
from trainmaster.wallet.budget import Budget

pytestmark = pytest.mark.slow


@pytest.fixture
def crowded(tmp_path):
    """45 jobs: 40 accepted on local ($0.10 each), 2 running, 1 failed today, 1 submitted, and one cancelled on azure
    before it ran; a $1,000 monthly budget; one job's fetched metrics."""
    filler = Filler(tmp_path / "home")
    for i in range(40):
        filler.submit(f"done-{i:02d}")
        filler.accept(f"done-{i:02d}", filler.dispatch(f"done-{i:02d}", "local", 200_000), 100_000)
    for job_id in ("run-1", "run-2"):
        filler.submit(job_id)
        filler.dispatch(job_id, "local", 100_000)
    filler.submit("broke")
    filler.reject("broke", filler.dispatch("broke", "local", 100_000), "the script exited with code 1")
    filler.submit("waiting")
    filler.submit("never-ran")
    filler.cancel_before_it_ran("never-ran", "azure")
    filler.write_metrics("done-39", [{"step": s, "loss": 3.0 / s} for s in range(1, 101)])
    served = serve(filler.path, [Budget(cap="1000", period="month")])
    yield served
    served.stop()
    filler.close()


def test_the_summary_comes_first_and_the_jobs_are_paged(crowded, page):
    page.goto(crowded.url + "/dashboard")
    summary = page.locator("#summary")
    assert summary.bounding_box()["y"] < 120  # at the top
    assert page.text_content("#running b") == "2"
    assert page.text_content("#queued b") == "0"
    assert page.text_content("#failed-today b") == "1"
    assert "$4.00 of $1,000.00 (0%) of the budget" in page.text_content("#spend-month")
    assert page.locator("#jobs tbody tr").count() == 20
    assert "page 1 of 3 (45 jobs, 20 a page)" in page.text_content("#pager")
    spend = page.locator("figure.chart").first
    assert spend.bounding_box()["y"] < 1400, spend.bounding_box()  # within reach, not under 50 rows
    page.click("#older")
    assert "page 2 of 3" in page.text_content("#pager") and page.locator("#jobs tbody tr").count() == 20
    page.click("#older")
    assert "page 3 of 3" in page.text_content("#pager") and page.locator("#jobs tbody tr").count() == 5
    assert page.locator("#older").count() == 0
    page.wait_for_timeout(2500)  # a poll of the live states keeps the page it is on
    assert page.locator("#jobs tbody tr").count() == 5


def test_a_job_that_never_ran_shows_no_backend(crowded, page):
    page.goto(crowded.url + "/dashboard")
    row = page.locator('tr[data-job="never-ran"] td')
    assert row.nth(2).text_content() == "cancelled" and row.nth(3).text_content() == "-"
    page.wait_for_timeout(2500)  # and after a live redraw
    assert page.locator('tr[data-job="never-ran"] td').nth(3).text_content() == "-"


def test_the_charts_have_labelled_axes_and_the_spend_fills_its_chart(crowded, page):
    page.goto(crowded.url + "/dashboard")
    spend = page.locator("figure.chart").first
    assert spend.locator(".x-label").text_content() == "day of the month (UTC)"
    assert spend.locator(".y-label").text_content() == "USD charged"
    assert spend.locator(".y-tick").count() >= 3 and spend.locator(".x-tick").count() >= 1
    assert spend.locator("polyline[stroke-dasharray]").count() == 0  # the $1,000 cap is not drawn over $4 of spend
    assert "cap: month: all spend is $1,000.00, far above the chart: 0.4% of it is spent" in \
        spend.locator(".off-chart").text_content()
    ys = [float(p.split(",")[1]) for p in spend.locator("polyline").first.get_attribute("points").split()]
    assert max(ys) - min(ys) > 100  # the spend rises across the chart (it was a flat line under the cap)
    curve = page.locator("#curves figure.chart").first
    assert curve.locator(".x-label").text_content() == "step" and curve.locator(".y-label").text_content() == "value"
    assert "100" in [t.text_content() for t in curve.locator(".x-tick").all()]

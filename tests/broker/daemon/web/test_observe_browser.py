"""The dashboard in headless Chromium (Debian's `/usr/bin/chromium`, driven by Playwright): it loads, shows
the jobs and their charts, renders a hostile job name and reason as text (no script runs), follows a job's
state live, signs in through the token cookie, and draws a screenshot that is not blank."""

from __future__ import annotations

import io
import statistics

import pytest

from browser_support import VIEWPORT, browser, page  # noqa: F401  (the Chromium fixtures)
from observe_support import HOSTILE

pytestmark = pytest.mark.slow


def test_the_page_shows_the_jobs_and_charts_and_a_hostile_name_stays_text(served, page):
    page.goto(served.url + "/dashboard")
    assert page.locator("#jobs tbody tr").count() == 5
    assert page.text_content('tr[data-job="d"] .state') == "running"
    assert page.locator('tr[data-job="c"] td').nth(1).text_content() == HOSTILE  # the name, as text
    assert page.locator('tr[data-job="c"] td').nth(6).text_content() == HOSTILE  # the reason, as text
    assert page.locator("#verdicts").inner_text().count("window.pwned=1") == 1
    assert page.locator("img").count() == 0  # no <img onerror> made it into the document
    assert page.evaluate("window.pwned") is None and page.dialogs == []
    assert page.locator("figure.chart").count() == 2  # spend, and job a's curves
    assert page.locator("#curves polyline").count() == 2  # loss and lr
    assert page.locator("#curves figcaption").text_content() == "a"


def test_a_job_s_state_changes_on_the_page_without_a_reload(served, page):
    from playwright.sync_api import expect

    page.goto(served.url + "/dashboard")
    page.evaluate("window.sameDocument = true")
    served.filler.accept("d", "d.1", 1_000_000)
    expect(page.locator('tr[data-job="d"] .state')).to_have_text("accepted", timeout=10_000)  # polled every 2 s
    assert page.evaluate("window.sameDocument") is True
    assert page.locator('tr[data-job="c"] td').nth(1).text_content() == HOSTILE  # redrawn rows: still text
    assert page.evaluate("window.pwned") is None and page.locator("img").count() == 0


def test_the_token_in_the_address_becomes_a_cookie_scripts_cannot_read(served, page):
    page.goto(served.url + "/dashboard?token=tok-123")
    assert page.url == served.url + "/dashboard"
    [cookie] = page.context.cookies()
    assert (cookie["name"], cookie["value"], cookie["httpOnly"], cookie["sameSite"]) == \
        ("trainmaster_token", "tok-123", True, "Strict")
    assert "tok-123" not in page.evaluate("document.cookie")


def test_a_screenshot_is_drawn_at_the_viewport_size_and_is_not_blank(served, page):
    from PIL import Image

    page.goto(served.url + "/dashboard")
    png = page.screenshot()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(png))
    assert image.size == (VIEWPORT["width"], VIEWPORT["height"])
    grey = list(image.convert("L").tobytes())
    assert statistics.pstdev(grey) > 10  # text, tables and charts, not one flat colour
    rgb = image.convert("RGB").tobytes()
    assert bytes((0x1F, 0x77, 0xB4)) in {rgb[i:i + 3] for i in range(0, len(rgb), 3)}  # the first chart line's colour is drawn

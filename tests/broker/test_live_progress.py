"""Progress while waiting: the status a terminal shows under a followed log (broker/job_progress.py computes
it, broker/cli/live.py draws it), and no status line when stdout is not a terminal or with --json."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pty_follow import on_terminal, terminal_env
from trainmaster.backends.base import Handle, Offer
from trainmaster.backends.features import MetricsChunk
from trainmaster.backends.local import LocalBackend
from trainmaster.broker import paths
from trainmaster.broker.job_progress import (
    ProgressWatch, StepSample, attempt_cost, last_step, progress_of, read_tail, total_steps,
)
from trainmaster.broker.store import Attempt, Job
from trainmaster.jobs.spec import JobSpec

PRICE = 3_600_000  # micro-USD per hour: 1,000 micro-USD per second
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
STATUS_LINE = re.compile(r"\b(?:dispatched|running|returned|verifying|accepted) · (?:step \d|elapsed )")


def _attempt(n: int = 1, *, state: str = "running", started_at: float | None = 1000.0, ended_at: float | None = None,
             cost: int | None = None, price: int = PRICE) -> Attempt:
    offer = Offer(backend="local", instance="cpu", price_per_hour_micro_usd=price, trusted=True)
    return Attempt(id=f"j.{n}", job_id="j", n=n, backend="local", offer_json=offer.model_dump_json(),
                   handle_json=json.dumps({"backend": "local", "attempt_id": f"j.{n}",
                                            "data": {"workdir": str(paths.attempt_dir("j", n))}}),
                   state=state, reason=None,
                   started_at=started_at, ended_at=ended_at, cost_micro_usd=cost, cost_rao=None,
                   billable_seconds=None, created_at=999.0)


class _Store:
    """What ProgressWatch reads of a store: a job and its attempts."""

    def __init__(self, entrypoint: str, attempts: list[Attempt], state: str = "running"):
        spec_json = JobSpec.model_validate({"name": "j", "entrypoint": entrypoint}).model_dump_json()
        self.job_row = Job(id="j", name="j", workload="development", project=None, state=state, spec_json=spec_json,
                           spec_path="job.yaml", bundle_sha256="0" * 64, policy="default", reason=None,
                           created_at=998.0, updated_at=998.0)
        self.rows = attempts

    def job(self, job_id):
        return self.job_row

    def attempts(self, job_id):
        return self.rows


class _Broker:
    """What ProgressWatch asks of a broker: its store, and each attempt's backend (a real local one)."""

    def __init__(self, store, backend=None):
        self.store = store
        self._backend = backend or LocalBackend()

    def policy(self, job):
        return None

    def backend(self, name, policy):
        return self._backend


def _sample(watch: ProgressWatch):
    return asyncio.run(watch.sample())


def _metrics(n: int, steps: range, at: float) -> Path:
    """The attempt's metrics.jsonl as the runtime writes it, its modification time set to `at`."""
    path = paths.attempt_dir("j", n) / "outputs" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"loss": 1.0 / s, "step": s}, sort_keys=True) + "\n" for s in steps))
    os.utime(path, (at, at))
    return path


# the status computation

def test_step_rate_eta_elapsed_and_cost_from_metrics(tm_home):
    clock = [1005.0]
    earlier = _attempt(1, state="failed", ended_at=1001.0, cost=1_234)
    live = _attempt(2, started_at=1000.0)
    watch = ProgressWatch(_Broker(_Store("python -m trainmaster.jobs.recipes.tiny_lm --steps 100", [earlier, live])),
                          "j", clock=lambda: clock[0])
    first = _sample(watch)  # no metrics yet: the state, time and cost are known, the step is not
    assert (first.state, first.step, first.total, first.steps_per_s, first.eta_s) == ("running", None, 100, None, None)
    assert first.elapsed_s == 5.0
    assert first.cost_micro_usd == 1_234 + 5_000  # the recorded cost, plus 5 s at 1,000 micro-USD/s

    _metrics(2, range(1, 21), at=1002.0)
    one = _sample(watch)  # one step seen: the rate is the step over the attempt's time until the file held it
    assert (one.step, one.steps_per_s, one.eta_s) == (20, 10.0, 8.0)  # 20 steps in 2 s; 80 left

    _metrics(2, range(1, 61), at=1004.0)
    clock[0] = 1006.5
    two = _sample(watch)
    assert (two.step, two.total) == (60, 100)
    assert two.steps_per_s == pytest.approx(20.0)  # 40 steps between the file's two modification times
    assert two.eta_s == pytest.approx(2.0)  # 40 steps left at 20 steps/s
    assert two.elapsed_s == 6.5
    assert two.cost_micro_usd == 1_234 + 6_500 and isinstance(two.cost_micro_usd, int)


def test_a_new_attempt_counts_its_own_steps(tm_home):
    store = _Store("python train.py --steps=50", [_attempt(1)])
    watch = ProgressWatch(_Broker(store), "j", clock=lambda: 1010.0)
    _metrics(1, range(1, 41), at=1002.0)
    _sample(watch)
    _metrics(1, range(1, 46), at=1003.0)
    assert _sample(watch).steps_per_s == pytest.approx(5.0)
    store.rows = [_attempt(1, state="failed", ended_at=1003.0, cost=0), _attempt(2, started_at=1004.0)]
    _metrics(2, range(1, 11), at=1005.0)
    fresh = _sample(watch)  # not 10 steps since the old attempt's sample: its own 10 in its own 1 s
    assert (fresh.step, fresh.total, fresh.steps_per_s, fresh.eta_s) == (10, 50, 10.0, 4.0)


def test_an_ended_attempt_has_no_eta_and_its_time_stops(tm_home):
    ended = _attempt(1, state="verifying", started_at=1000.0, ended_at=1030.0, cost=30_000)
    samples = [StepSample(10, 1010.0), StepSample(100, 1028.0)]
    p = progress_of("verifying", [ended], samples, 100, now=5000.0)
    assert (p.step, p.steps_per_s, p.eta_s, p.elapsed_s, p.cost_micro_usd) == (100, 5.0, None, 30.0, 30_000)


def test_a_job_that_ends_between_two_samples_keeps_a_rate(tm_home):
    """A fast job: the watcher sees no step while it runs and only its last step once it ended. The line
    still has a rate (the step over the attempt's running time until the file held it), and no ETA."""
    clock = [1001.0]
    store = _Store("python train.py --steps 100", [_attempt(1, started_at=1000.0)])
    watch = ProgressWatch(_Broker(store), "j", clock=lambda: clock[0])
    assert _sample(watch).steps_per_s is None  # no step known: no rate
    _metrics(1, range(1, 101), at=1004.0)
    store.rows = [_attempt(1, state="returned", started_at=1000.0, ended_at=1004.5, cost=4_500)]
    store.job_row = Job(**{**store.job_row.__dict__, "state": "accepted"})
    clock[0] = 1010.0
    final = _sample(watch)
    assert (final.state, final.step, final.total, final.steps_per_s, final.eta_s) == ("accepted", 100, 100, 25.0, None)
    assert _sample(watch).steps_per_s == 25.0  # the final line keeps its rate


def test_a_rate_needs_a_step_after_the_start():
    """A step of 0, or a file older than the attempt's start (left by an earlier run), gives no rate."""
    live = _attempt(1, started_at=1000.0)
    assert progress_of("running", [live], [StepSample(0, 1002.0)], 10, now=1003.0).steps_per_s is None
    assert progress_of("running", [live], [StepSample(5, 999.0)], 10, now=1003.0).steps_per_s is None


def test_an_attempt_whose_backend_cannot_report_metrics_shows_state_elapsed_and_cost_only(tm_home):
    """A backend without the metrics capability: no step, rate or ETA, whatever files lie in the attempt dir."""
    remote = _attempt(1, started_at=None)  # not yet seen running: timed from its dispatch (created_at)
    _metrics(1, range(1, 6), at=1005.0)  # never read: the broker opens no backend's folder
    watch = ProgressWatch(_Broker(_Store("python train.py --steps 10", [remote]), backend=object()), "j",
                          clock=lambda: 1009.0)
    p = _sample(watch)
    assert (p.step, p.steps_per_s, p.eta_s, p.total) == (None, None, None, 10)
    assert p.elapsed_s == 10.0 and p.cost_micro_usd == 10_000


def test_cost_is_integer_micro_usd_rounded_up_as_the_local_backend_charges():
    cheap = _attempt(1, started_at=1000.0, price=1)  # 1 micro-USD per hour
    assert attempt_cost(cheap, 1001.0) == 1
    assert attempt_cost(_attempt(1, started_at=1000.0, price=7_200_000), 1000.25) == 500
    assert attempt_cost(_attempt(1, cost=42), 9999.0) == 42  # a recorded cost is the cost
    never = Attempt(**{**_attempt(1).__dict__, "handle_json": None})
    assert attempt_cost(never, 9999.0) == 0


def test_total_steps_from_the_entrypoint():
    assert total_steps("python -m trainmaster.jobs.recipes.tiny_lm --steps 400 --d-model 32", {}) == 400
    assert total_steps("python train.py --steps=250", {}) == 250
    assert total_steps("python train.py --steps $STEPS", {"STEPS": "30"}) == 30
    assert total_steps("python train.py --epochs 3", {}) is None
    assert total_steps("python train.py --steps lots", {}) is None
    assert total_steps("python train.py --steps", {}) is None


def test_last_step_skips_a_torn_line_and_junk():
    data = b'{"loss": 0.5, "step": 7}\n{"step": 8}\n[1, 2]\n{"step": true}\nnot json\n{"step": 9, "lo'
    assert last_step(MetricsChunk(data=data, offset=0, size=len(data), modified_at=1234.0)) == StepSample(8, 1234.0)
    assert last_step(MetricsChunk(data=b"", offset=0, size=0)) is None  # no file
    assert last_step(MetricsChunk(data=b"", offset=0, size=0, modified_at=1234.0)) is None  # an empty one
    cut = b'"step": 5}\n{"step": 6}\n'  # read from an offset: the first piece may be a line's end
    assert last_step(MetricsChunk(data=cut, offset=10, size=10 + len(cut), modified_at=1.0)) == StepSample(6, 1.0)
    assert last_step(MetricsChunk(data=cut[:11], offset=10, size=10 + len(cut), modified_at=1.0)) is None


def test_a_huge_metrics_file_is_read_by_its_tail_only(tmp_path):
    """8 GiB of metrics (sparse, so the test is cheap), asked of the local backend's metrics capability:
    the last step comes back after reading a few KB."""
    workdir = tmp_path / "attempt"
    (workdir / "outputs").mkdir(parents=True)
    with open(workdir / "outputs" / "metrics.jsonl", "wb") as f:
        f.truncate(8 * 2**30)
        f.seek(0, io.SEEK_END)
        f.write(b"".join(b'{"loss": 0.1, "step": %d}\n' % s for s in range(999_900, 1_000_001)))
    handle = Handle(backend="local", attempt_id="j.1", data={"workdir": str(workdir)})
    io_stats = Path("/proc/self/io")
    before = _bytes_read(io_stats)
    chunk = asyncio.run(read_tail(LocalBackend(), handle))
    assert last_step(chunk).step == 1_000_000
    assert _bytes_read(io_stats) - before < 64 * 1024  # its head and tail (4 KB each) and the /proc read itself


def _bytes_read(io_stats: Path) -> int:
    return int(re.search(r"^rchar: (\d+)$", io_stats.read_text(), re.M)[1])


def test_status_line_text():
    from trainmaster.broker.cli.live import render
    from trainmaster.broker.job_progress import JobProgress

    full = render(JobProgress("running", 1_200, 10_000, 41.5, 31.0, 412, 212.0)).plain
    assert full == "running · step 1,200/10,000 · 41.5 steps/s · elapsed 0:31 · cost $0.000412 · ETA 3:32"
    assert render(JobProgress("running", elapsed_s=3_700.0, cost_micro_usd=1_500_000)).plain == \
        "running · elapsed 1:01:40 · cost $1.50"
    assert render(JobProgress("returned"), (58_700_000, 209_700_000)).plain == \
        "returned · cost $0.00 · fetching 58.7/209.7 MB"


def test_shown_draws_the_line_takes_the_transfers_and_gives_them_back(tm_home, monkeypatch):
    """While shown: the log above, the line redrawn, the job advanced, a fetch's progress drawn on the line
    (not as a second live display); after: the last line left, a torn last log line printed, the
    broker's own progress callback back."""
    import asyncio

    from rich.console import Console

    from trainmaster.broker.cli import live

    now = time.time()
    store = _Store("python train.py --steps 40", [_attempt(1, started_at=now - 4.0)])
    _metrics(1, range(1, 11), at=now - 2.0)  # 10 steps in the attempt's first 2 s
    advanced: list[str] = []

    class Broker(_Broker):
        progress = staticmethod(lambda done, total: None)

        async def advance(self, job_id):
            advanced.append(job_id)

    broker, own = Broker(store), Broker.progress
    out = io.StringIO()
    line = live.StatusLine(Console(file=out, force_terminal=True, width=200))

    async def follow():
        async with line.shown(broker, "j"):
            line.write("epoch 1\nepoch 2 (no newline yet)")
            broker.progress(5_000_000, 10_000_000)
            await asyncio.sleep(0.5)
            assert line._transfer == (5_000_000, 10_000_000)
            broker.progress(10_000_000, 10_000_000)

    monkeypatch.setattr(live, "ADVANCE_S", 0.3)
    monkeypatch.setattr(live, "REDRAW_S", 0.1)
    asyncio.run(follow())
    shown = ANSI.sub("", out.getvalue())
    assert "epoch 1\n" in shown and "epoch 2 (no newline yet)" in shown
    assert "running · step 10/40 · 5.00 steps/s · elapsed 0:0" in shown and "fetching 5.0/10.0 MB" in shown
    last = re.split(r"[\r\n]", shown.rstrip("\n"))[-1]
    assert last.startswith("running · step 10/40 · ") and "fetching" not in last  # the fetch done
    assert advanced and broker.progress is own


def test_log_lines_above_the_status_line_are_printed_as_written():
    from rich.console import Console

    from trainmaster.broker.cli.live import StatusLine

    out = io.StringIO()
    line = StatusLine(Console(file=out, width=200))
    line.write("loss [red]0.5[/red] at step")
    assert out.getvalue() == ""  # a line still being written waits for its end
    line.write(" 3\r\n10%\r100%\ndone\n")
    assert out.getvalue() == "loss [red]0.5[/red] at step 3\n100%\ndone\n"  # never markup; \r as a terminal shows it


# end to end: the CLI under a pseudo-terminal, and not on one

METRICS_SCRIPT = """
import json, os, pathlib, time
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
with open(out / "metrics.jsonl", "w") as f:
    for step in range(1, 41):
        f.write(json.dumps({"loss": 1 / step, "step": step}, sort_keys=True) + "\\n")
        f.flush()
        time.sleep(0.05)
print("trained", flush=True)
"""

GATED_SCRIPT = """
import json, os, pathlib, time
out, go = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"]), pathlib.Path(os.environ["GO_FILE"])
with open(out / "metrics.jsonl", "w") as f:
    for step in range(1, 101):
        f.write(json.dumps({"loss": 1 / step, "step": step}, sort_keys=True) + "\\n")
        if step == 50:
            f.flush()
            deadline = time.monotonic() + 120
            while not go.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
print("trained", flush=True)
"""
METRICS_AT_ONCE = """
import json, os, pathlib
out = pathlib.Path(os.environ["TRAINMASTER_OUTPUT_DIR"])
(out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\\n" for s in range(1, 101)))
"""


def _tm(*args: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                          env=terminal_env(home), timeout=240)


@pytest.mark.slow
def test_submit_wait_on_a_terminal_shows_the_status_line(job_factory, tmp_path):
    """The job writes 50 steps and waits until the test has seen them on the status line, so the line is
    seen mid-run however fast the machine; the last 50 steps land between two samples."""
    go = tmp_path / "go"
    spec = job_factory(GATED_SCRIPT, f"env:\n  GO_FILE: {go}\n", entrypoint="python train.py --steps 100")

    def release(shown: str) -> None:
        if re.search(r"running · step 50/100 · [\d,.]+ steps/s · ", shown):
            go.touch()

    code, shown = on_terminal("submit", str(spec), "--wait", home=tmp_path / "home", on_output=release)
    assert code == 0, shown
    assert go.exists(), shown  # state, step/T and a rate while it trains
    assert re.search(r"accepted · step 100/100 · [\d,.]+ steps/s · elapsed \d+:\d\d · cost \$", shown), shown
    assert "trained" in shown  # the log streamed above it


@pytest.mark.slow
def test_a_job_faster_than_the_samples_keeps_its_rate_on_the_last_line(job_factory, tmp_path):
    """100 steps written at once, before the first sample can see two of them: the final line has a rate."""
    spec = job_factory(METRICS_AT_ONCE, entrypoint="python train.py --steps 100")
    code, shown = on_terminal("submit", str(spec), "--wait", home=tmp_path / "home")
    assert code == 0, shown
    assert re.search(r"accepted · step 100/100 · [\d,.]+ steps/s · elapsed \d+:\d\d · cost \$", shown), shown


@pytest.mark.slow
def test_logs_follow_on_a_terminal_shows_the_status_line(job_factory, tmp_path):
    home = tmp_path / "home"
    spec = job_factory(METRICS_SCRIPT)
    job = json.loads(_tm("submit", str(spec), "--json", home=home).stdout)
    code, shown = on_terminal("logs", "-f", job["id"], home=home)
    assert code == 0, shown
    assert "trained" in shown
    assert re.search(r"(?:running|verifying|accepted) · step \d+ · ", shown), shown  # no --steps: no T


@pytest.mark.slow
def test_no_status_line_off_a_terminal_or_with_json(job_factory, tmp_path):
    home = tmp_path / "home"
    spec = job_factory(METRICS_SCRIPT, entrypoint="python train.py --steps 40")
    piped = _tm("submit", str(spec), "--wait", home=home)
    assert piped.returncode == 0, piped.stderr
    assert "trained" in piped.stdout
    assert not STATUS_LINE.search(piped.stdout + piped.stderr) and "steps/s" not in piped.stdout
    code, shown = on_terminal("submit", str(spec), "--wait", "--json", home=home)
    assert code == 0, shown
    assert not STATUS_LINE.search(shown) and "steps/s" not in shown
    assert json.loads(shown)["state"] == "accepted"

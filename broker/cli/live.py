"""The live status line under a followed log, on a terminal only: state, step/T, steps/s, elapsed
time, cost so far and ETA (computed by broker/job_progress.py), redrawn every REDRAW_S.

Not a terminal, or `--json`: the commands stream the log plainly and draw nothing (jobs.py decides).
"""

from __future__ import annotations

import asyncio
import math
from contextlib import asynccontextmanager

from rich.ansi import AnsiDecoder
from rich.console import Console
from rich.live import Live
from rich.text import Text

from trainmaster.broker.cli.render import STATE_STYLE
from trainmaster.broker.job_progress import JobProgress, ProgressWatch
from trainmaster.jobs.money import display_usd

REDRAW_S = 0.5
ADVANCE_S = 1.0
MAX_SHOWN_S = 10_000 * 3600


def for_terminal() -> StatusLine | None:
    """A status line for stdout when it is a terminal Rich can redraw on, else None."""
    console = Console()
    return StatusLine(console) if console.is_terminal and not console.is_dumb_terminal else None


def duration(seconds: float) -> str:
    """`m:ss`, or `h:mm:ss` from an hour; `—` for a time that is not one (negative, NaN, ±Inf), and
    `>9999:59:59` past that (an ETA from a job's hostile step count)."""
    if not 0 <= seconds < math.inf:
        return "—"
    if seconds >= MAX_SHOWN_S:
        return f">{duration(MAX_SHOWN_S - 1)}"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def render(p: JobProgress, transfer: tuple[int, int] | None = None) -> Text:
    """One line: `running · step 1,200/10,000 · 41.5 steps/s · elapsed 0:31 · cost $0.000412 · ETA 3:32`
    (unknowns left out), and while outputs are fetched, how far (`transfer`: bytes done, total)."""
    parts = [Text(p.state, style=STATE_STYLE.get(p.state, "bold"))]
    if p.step is not None:
        parts.append(Text(f"step {p.step:,}" + (f"/{p.total:,}" if p.total is not None else "")))
    if p.steps_per_s is not None:
        parts.append(Text(f"{p.steps_per_s:,.1f} steps/s" if p.steps_per_s >= 10 else f"{p.steps_per_s:.2f} steps/s"))
    if p.elapsed_s is not None:
        parts.append(Text(f"elapsed {duration(p.elapsed_s)}"))
    parts.append(Text(f"cost {display_usd(p.cost_micro_usd)}"))
    if p.eta_s is not None:
        parts.append(Text(f"ETA {duration(p.eta_s)}"))
    if transfer is not None:
        parts.append(Text(f"fetching {transfer[0] / 1e6:,.1f}/{transfer[1] / 1e6:,.1f} MB"))
    line = Text(no_wrap=True, overflow="ellipsis")
    for i, part in enumerate(parts):
        if i:
            line.append(" · ", style="dim")
        line.append_text(part)
    return line


class StatusLine:
    """Log text printed line by line above a status line that stays at the bottom of the terminal."""

    def __init__(self, console: Console):
        self.console = console
        self._partial = ""
        self._decoder = AnsiDecoder()
        self._transfer: tuple[int, int] | None = None

    def write(self, text: str) -> None:
        """The log's `on_log`: complete lines are printed (above the status line while it is shown);
        a line still being written waits for its end."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        if lines:
            self._print(lines)

    def _print(self, lines: list[str]) -> None:
        # as a terminal shows a line: its colours kept, what a carriage return overwrote dropped; never markup
        shown = Text("\n").join(self._decoder.decode_line(line.rstrip("\r")) for line in lines)
        self.console.print(shown, soft_wrap=True)

    def _transferred(self, done: int, total: int | None) -> None:
        """The broker's transfer progress while the line is shown (called from worker threads): the
        fetch is drawn on the status line, not as a second live display fighting it for the bottom line."""
        self._transfer = (done, total) if total and done < total else None

    @asynccontextmanager
    async def shown(self, broker, job_id: str):
        """The status line, while the body follows the job's log. The broker advances the job only at
        the log's end, so the state (running, its start) is brought up to date here every ADVANCE_S.
        Leaving (also by Ctrl-C: the task cancelled) stops the redraws and the Live, leaving the last line."""
        watch = ProgressWatch(broker, job_id)
        transfers, broker.progress = broker.progress, self._transferred
        try:
            with Live(render(await watch.sample()), console=self.console, auto_refresh=False, transient=False) as live:
                tasks = [asyncio.create_task(self._redraw(live, watch)), asyncio.create_task(_advance(broker, job_id))]
                try:
                    yield
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    if self._partial:
                        self._print([self._partial])
                        self._partial = ""
                    live.update(render(await watch.sample()), refresh=True)
        finally:
            broker.progress = transfers

    async def _redraw(self, live: Live, watch: ProgressWatch) -> None:
        while True:
            await asyncio.sleep(REDRAW_S)
            live.update(render(await watch.sample(), self._transfer), refresh=True)


async def _advance(broker, job_id: str) -> None:
    while True:
        await asyncio.sleep(ADVANCE_S)
        try:
            await broker.advance(job_id)
        except Exception:  # noqa: BLE001 — the followed log's own advance meets the same error and reports it
            continue

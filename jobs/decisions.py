"""Decision traces: the data-dependent discrete choices a step makes, recorded and optionally forced.

A training step routes each such choice (an environment action, minibatch indices drawn from
priorities, the Double-DQN target argmax, a top-k) through :meth:`DecisionLog.decide`. Normally
that records the trainer's own choice. When a verifier re-executes a segment with the executor's
trace *forced*, ``decide`` returns the recorded choice instead and notes where the verifier's own
values would have chosen otherwise, and by what margin: how far its values were from preferring
the recorded choice. Honest executors disagree only on near-ties (tiny margins); a cheat shows up
as many disagreements or large ones (docs/protocol.md §6).

Trace layout (a canonical tensor dict, docs/runtime.md "Decision traces"): one int64 tensor per
step and decision, named ``step/<12-digit zero-padded step>/<name>``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

MarginFn = Callable[[torch.Tensor], torch.Tensor]
"""Given the forced choices, each element's margin: how much the decider's own values prefer its own choice."""

_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_ENTRY = re.compile(r"step/(\d{12})/([A-Za-z0-9_.:-]+)")


class DecisionTraceError(ValueError):
    """A trace that does not fit the code path re-executing it (missing, extra or misshapen decisions)."""


ENTRY_HEADER_BYTES = 192
"""More than one trace entry takes in the file's header (its name, dtype, shape and offsets)."""


def entry_bytes(elements: int) -> int:
    """An upper bound on the bytes one decision of ``elements`` choices adds to a trace file."""
    return ENTRY_HEADER_BYTES + 8 * elements


def trace_name(step: int, name: str) -> str:
    """The tensor name of decision ``name`` at ``step``."""
    return f"step/{step:012d}/{name}"


def argmax_margin(scores: torch.Tensor) -> MarginFn:
    """Margins for an argmax over the last dimension: ``scores[own] - scores[forced]`` (float64)."""
    values = scores.detach().double().cpu()

    def margin(forced: torch.Tensor) -> torch.Tensor:
        own = values.max(dim=-1).values
        return own - values.gather(-1, forced.unsqueeze(-1)).squeeze(-1)

    return margin


def interval_margin(cdf: torch.Tensor, points: torch.Tensor) -> MarginFn:
    """Margins for inverse-CDF sampling: the distance from each draw to the forced choice's interval.

    ``cdf`` is the cumulative (unnormalised) weight of each choice and ``points`` the draws in the
    same units; choice ``j`` owns ``[cdf[j-1], cdf[j])``. Margins are divided by the total weight.
    """
    cdf, points = cdf.detach().double().cpu(), points.detach().double().cpu()
    total = cdf[-1]

    def margin(forced: torch.Tensor) -> torch.Tensor:
        upper = cdf[forced]
        lower = torch.where(forced > 0, cdf[(forced - 1).clamp(min=0)], torch.zeros_like(upper))
        return torch.clamp(torch.maximum(lower - points, points - upper), min=0.0) / total

    return margin


@dataclass(frozen=True)
class DecisionReport:
    """How a forced re-execution's own choices compared with the trace it was forced to follow."""

    compared: int = 0
    disagreements: int = 0
    max_margin: float = 0.0
    median_margin: float = 0.0
    by_name: dict[str, int] = field(default_factory=dict)


class DecisionTrace:
    """The decisions of one segment: ``(step, name) -> int64 tensor``."""

    def __init__(self, entries: Mapping[tuple[int, str], torch.Tensor] | None = None):
        self._entries: dict[tuple[int, str], torch.Tensor] = dict(entries or {})

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor]) -> DecisionTrace:
        """Parse a trace from its canonical tensor dict."""
        entries = {}
        for key, tensor in tensors.items():
            match = _ENTRY.fullmatch(key)
            if match is None or tensor.dtype != torch.int64:
                raise DecisionTraceError(f"{key!r} is not a decision trace entry (int64 step/<step>/<name>)")
            entries[(int(match.group(1)), match.group(2))] = tensor
        return cls(entries)

    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The canonical tensor dict of this trace."""
        return {trace_name(step, name): value for (step, name), value in self._entries.items()}

    def get(self, step: int, name: str) -> torch.Tensor | None:
        return self._entries.get((step, name))

    def add(self, step: int, name: str, value: torch.Tensor) -> None:
        if (step, name) in self._entries:
            raise DecisionTraceError(f"decision {name!r} made twice at step {step}")
        self._entries[(step, name)] = value

    def keys(self) -> set[tuple[int, str]]:
        return set(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


class DecisionLog:
    """Records one segment's decisions; with ``forced``, replays that trace and compares."""

    def __init__(self, forced: DecisionTrace | None = None):
        self.forced = forced
        self.trace = DecisionTrace()
        self.step = 0
        self._margins: list[float] = []
        self._disagreements: Counter[str] = Counter()
        self._compared = 0

    def begin_step(self, step: int) -> None:
        self.step = step

    def decide(self, name: str, own: torch.Tensor, upper: int, margin: MarginFn | None = None) -> torch.Tensor:
        """The choice to act on: ``own`` normally, the recorded one when forced.

        ``own`` holds integer choices in ``[0, upper)`` (any shape, on any device: the choice comes back
        on ``own``'s device, the trace keeps a host copy); a forced choice outside that
        range is refused. ``margin`` maps the forced choices to how much this run's values prefer
        its own choices; without it, a disagreement counts as an infinite margin (the choice was
        not a near-tie, e.g. it came from the step's own RNG).
        """
        if not _NAME.fullmatch(name):
            raise DecisionTraceError(f"decision name {name!r} must match [A-Za-z0-9_.:-]+")
        device = own.device
        own = own.detach().to("cpu", torch.int64).contiguous()  # traces are host tensors; a GPU's choice is copied
        chosen = own if self.forced is None else self._forced_choice(name, own, upper, margin)
        self.trace.add(self.step, name, chosen.clone())
        return chosen if device.type == "cpu" else chosen.to(device)

    def _forced_choice(self, name: str, own: torch.Tensor, upper: int, margin: MarginFn | None) -> torch.Tensor:
        assert self.forced is not None
        forced = self.forced.get(self.step, name)
        if forced is None:
            raise DecisionTraceError(f"the trace has no decision {name!r} at step {self.step}")
        if forced.shape != own.shape:
            raise DecisionTraceError(
                f"decision {name!r} at step {self.step}: trace shape {list(forced.shape)}, own {list(own.shape)}"
            )
        if forced.numel() and not (0 <= int(forced.min()) and int(forced.max()) < upper):
            raise DecisionTraceError(f"decision {name!r} at step {self.step} is outside [0, {upper})")
        differs = own != forced
        self._compared += own.numel()
        if bool(differs.any()):
            values = margin(forced)[differs] if margin else torch.full((int(differs.sum()),), math.inf)
            self._margins.extend(values.double().tolist())
            self._disagreements[name] += int(differs.sum())
        return forced

    def check_complete(self) -> None:
        """Raise if the forced trace holds decisions this re-execution never asked for."""
        if self.forced is not None and (extra := self.forced.keys() - self.trace.keys()):
            step, name = min(extra)
            raise DecisionTraceError(f"the trace has {len(extra)} unused decisions, first {name!r} at step {step}")

    def report(self) -> DecisionReport:
        return DecisionReport(
            compared=self._compared,
            disagreements=len(self._margins),
            max_margin=max(self._margins, default=0.0),
            median_margin=statistics.median(self._margins) if self._margins else 0.0,
            by_name=dict(self._disagreements),
        )

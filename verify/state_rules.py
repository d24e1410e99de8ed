"""The rest of the executor's S_{i+1} against the verifier's, entry by entry, under the recipe's field rules.

The weights are compared by r (:mod:`trainmaster.verify.distance`); every other entry of the state
has a rule on its recipe (:class:`trainmaster.jobs.recipe.StateRules`; the runtime's ``runtime/...``
entries are exact), and an entry that no rule covers is refused — nothing in a state is taken on
trust. Per rule (docs/audit.md, "What is re-executed, and compared"):

* ``exact``: bit for bit; differing entries are listed by name;
* ``tolerance`` (optimizer moments, target networks): ``‖X_exec − X_re‖ / ‖X_re − X_i‖`` over all
  entries of one pattern, X_i being S_i's entry (zero where S_i has none, e.g. before the first
  optimizer step). Every value must be finite, in S_i as in S_{i+1};
* ``close`` (priorities, log-probs, values recomputed from the weights):
  ``‖X_exec − X_re‖ / ‖X_re‖`` over the finite values of one pattern; where the re-execution holds
  NaN or ±Inf (a sentinel, such as ``last_loss = NaN`` before learning starts) the executor must hold
  the same, and nowhere else;
* ``reported`` (losses kept for metrics and the result, never read back by training): measured as
  ``close``, within the fixed :data:`REPORTED_TOLERANCE` instead of a calibrated one.

A group's measure is 0 when both norms are 0, and ∞ when only the divergence is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from trainmaster.jobs.recipe import FieldRule, StateRules
from trainmaster.jobs.state_diff import describe, same_bits

Tensors = Mapping[str, torch.Tensor]
RUNTIME_PATTERN = "runtime/*"
REPORTED_TOLERANCE = 0.1
"""How far a ``reported`` figure may be from the re-execution's, relatively (10 %). Honest executors
differ by up to about 1 % in one batch's loss (bench_false_rejects); nothing in training reads it."""


@dataclass
class GroupDistance:
    """One ``tolerance`` or ``close`` pattern's entries, compared together."""

    rule: FieldRule
    divergence_sq: float = 0.0
    scale_sq: float = 0.0
    worst: str = ""
    worst_sq: float = -1.0

    @property
    def r(self) -> float:
        divergence, scale = math.sqrt(self.divergence_sq), math.sqrt(self.scale_sq)
        if scale > 0:
            return divergence / scale
        return 0.0 if divergence == 0 else math.inf

    def add(self, name: str, divergence_sq: float, scale_sq: float) -> None:
        self.divergence_sq += divergence_sq
        self.scale_sq += scale_sq
        if divergence_sq > self.worst_sq:
            self.worst, self.worst_sq = name, divergence_sq


@dataclass
class RestComparison:
    """What :func:`compare_rest` found."""

    compared: int = 0
    exact_mismatches: list[str] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    """How the first few exact mismatches differ, in words (a JSON entry names its key)."""
    groups: dict[str, GroupDistance] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Entries refused outright: no rule, present on one side only, another dtype or shape, non-finite."""


def rule_of(rules: StateRules, name: str) -> tuple[str, FieldRule] | None:
    """``(pattern, rule)`` for a rest entry; the runtime's own entries are exact."""
    if name.startswith("runtime/"):
        return RUNTIME_PATTERN, "exact"
    return rules.rule(name)


def non_finite_entries(rules: StateRules, rest: Tensors) -> list[str]:
    """The ``tolerance`` entries of a rest holding NaN or ±Inf (an optimizer moment never may)."""
    return sorted(
        name
        for name, tensor in rest.items()
        if (found := rule_of(rules, name)) is not None
        and found[1] == "tolerance"
        and tensor.is_floating_point()
        and not bool(torch.isfinite(tensor).all())
    )


def compare_rest(rules: StateRules, start: Tensors, replayed: Tensors, executed: Tensors) -> RestComparison:
    """Compare the executor's rest of S_{i+1} (``executed``) with the verifier's (``replayed``); ``start`` is S_i's."""
    result = RestComparison()
    for name in sorted(replayed.keys() | executed.keys()):
        found = rule_of(rules, name)
        if found is None:
            result.problems.append(f"{name}: no rule of the recipe covers this entry, so it is refused")
            continue
        pattern, rule = found
        result.compared += 1
        if rule == "exact":
            if name not in replayed or name not in executed or not same_bits(replayed[name], executed[name]):
                result.exact_mismatches.append(name)
                if len(result.differences) < 3:
                    result.differences.append(describe(name, executed, replayed))
            continue
        if problem := _float_problem(name, replayed, executed):
            result.problems.append(problem)
            continue
        group = result.groups.setdefault(pattern, GroupDistance(rule))
        re, exe = replayed[name].cpu().double(), executed[name].cpu().double()  # host copies, whatever device
        if rule == "tolerance":
            if not bool(torch.isfinite(exe).all()):
                result.problems.append(f"{name}: holds NaN or Inf")
                continue
            before = start.get(name)
            origin = before.cpu().double() if before is not None and before.shape == re.shape else torch.zeros_like(re)
            group.add(name, _sq(exe - re), _sq(re - origin))
        else:
            if not all(torch.equal(test(re), test(exe)) for test in (torch.isnan, torch.isposinf, torch.isneginf)):
                result.problems.append(f"{name}: its NaN or ±Inf values are not where the re-execution has them")
                continue
            finite = torch.isfinite(re)
            group.add(name, _sq(exe[finite] - re[finite]), _sq(re[finite]))
    return result


def _float_problem(name: str, replayed: Tensors, executed: Tensors) -> str | None:
    if name not in executed:
        return f"{name}: missing"
    if name not in replayed:
        return f"{name}: unexpected entry"
    re, exe = replayed[name], executed[name]
    if exe.dtype != re.dtype or exe.shape != re.shape:
        return f"{name}: {exe.dtype} {list(exe.shape)}, not {re.dtype} {list(re.shape)}"
    if not re.is_floating_point():
        return f"{name}: compared within a tolerance, but not a float ({re.dtype})"
    return None


def _sq(difference: torch.Tensor) -> float:
    return float(difference.square().sum())

"""The sampled tier: a few chunks of every boundary, opened with proofs and checked without a replay.

docs/protocol.md §3b, docs/audit.md. The executor opens, for every boundary b = 0..n, the chunks that
``jobs/boundary_chunks.py`` draws from the root and the challenged segments. Each chunk's proof must
lead to its file's digest, the digests to leaf b, and leaf b to the signed root; then, per boundary
and per segment s (S_s → S_{s+1}):

* **exact fields** — ``runtime/step`` = b·k, ``runtime/seed``, ``runtime/recipe.json`` and
  ``runtime/config.json`` the spec's, no ``runtime/world_size``; each optimizer's step counter never
  goes back, and its advance t in a segment is what the movement and moment bounds allow for;
* **weight movement** — for Adam-family optimizers (the spec's betas), every sampled weight moves at
  most ``t·lr·(R(β) + wd·|w|)`` in a segment of t optimizer steps, R(β) the largest
  ``|m̂| / √v̂`` any gradients give (``verify/plausibility.py``'s bound with bias correction);
* **second moments** — every sampled ``exp_avg_sq`` element satisfies ``v_{s+1} ≥ β₂^t · v_s``
  (``v ← β₂ v + (1 − β₂) g²`` can fall no faster);
* **movement profile** — the sampled movement of segment s per optimizer step, ‖ΔW‖/t, is neither below
  1/F nor above F times the median of its neighbours' on *both* sides (F = :data:`PROFILE_FACTOR`), and a
  segment without steps amid neighbours that all have some is a freeze: a frozen segment
  (no movement) or a swapped model (a jump) stands out, a warm-up or a schedule does not. Edge
  segments (replayed anyway) and segments next to idle ones (updates every few segments) are not
  compared.

So a tampered interior boundary (a swap, a freeze, a written-in backdoor) shows at its own boundary,
whichever segments the replay audit draws. What stays beyond these checks — a push within the k-step
bound, lr × 0.99 — is the refereed tier's (not in this version).
"""

from __future__ import annotations

import base64
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainmaster.jobs.boundary_chunks import CHUNKS_DIR, DEFAULT_PER_SEGMENT, MAX_OPENING_BYTES, Layout, draw, wanted_chunks
from trainmaster.jobs.canonical import CanonicalError
from trainmaster.jobs.checkpoint import leaf_of, rest_of
from trainmaster.jobs.chunks import CHUNK_BYTES, chunk_count, verify_chunk
from trainmaster.jobs.commitment import Commitment
from trainmaster.jobs.files import HostileFile, read_regular
from trainmaster.jobs.state import tensor_json

from .boundary_evidence import BoundaryReport, Measurement
from .plausibility import moment_bound
from .signing import check_leaf

PROFILE_FACTOR = 20.0
"""F: a segment's sampled movement against its neighbours' medians on both sides (honest runs of the
shipped recipes stay within 3× of them; a freeze is 0, a swap hundreds of times more)."""
WINDOW = 3
"""Neighbours per side in the profile."""
V_SLACK = 1e-5
"""Room for float32 rounding in β₂·v."""
MOVE_SLACK = 1.05
HEADER_LIMIT = 16 * 1024 * 1024
"""A canonical header is at most 16 MiB (jobs/canonical.py)."""
MAX_REST_BYTES = 1 << 40
"""Without the job's layout (a caller's own use), a rest file's declared size is still bounded."""


@dataclass(frozen=True)
class Spec:
    """What the spec fixes that the checks compare against."""

    k: int
    seed: int
    recipe_json: bytes
    config_json: bytes
    weights_layout: Layout
    groups: list[dict[str, Any]] = field(default_factory=list)
    """Every optimizer's param groups as the spec builds them (lr, betas, weight_decay)."""
    max_rest_bytes: int | None = None
    """The largest rest file the job's layout allows (``OpeningLimits.rest_bytes``): a larger one is refused."""


@dataclass
class _Opened:
    weights: dict[int, bytes]
    rest: dict[int, bytes]
    rest_layout: Layout | None


def check_boundaries(commitment: Commitment, directory: Path, segments: Sequence[int], spec: Spec,
                     c: int = DEFAULT_PER_SEGMENT) -> BoundaryReport:
    """Open and check every boundary (see the module docstring); rejections are reasons, never exceptions."""
    n = commitment.n
    weights_length = spec.weights_layout.header_bytes + sum(e - b for _, _, b, e in spec.weights_layout.entries.values())
    draws = draw(commitment.root, segments, n, weights_length, c)
    reasons: list[str] = []
    measurements: list[Measurement] = []
    opened: list[_Opened | None] = []
    per_boundary: dict[int, list[str]] = {}
    total_chunks = total_bytes = 0
    for b in range(n + 1):
        try:
            got, names, size = _open(commitment, Path(directory), b, draws, weights_length, spec.max_rest_bytes)
        except _Refused as exc:
            reasons.append(f"boundary {b}: {exc}")
            opened.append(None)
            continue
        opened.append(got)
        per_boundary[b] = names
        total_chunks += len(names)
        total_bytes += size
        measurements += _exact(b, got, spec, reasons)
    if not reasons:
        measurements += _segments(n, opened, draws, spec, reasons)
    return BoundaryReport(
        passed=not reasons, reasons=reasons, boundaries=n + 1 - sum(o is None for o in opened), chunks=total_chunks,
        bytes_opened=total_bytes, per_boundary=per_boundary, measurements=measurements,
    )


class _Refused(Exception):
    pass


def _open(commitment: Commitment, directory: Path, b: int, draws, weights_length: int,
          max_rest: int | None) -> tuple[_Opened, list[str], int]:
    path = directory / CHUNKS_DIR / f"{b:08d}.json"
    try:
        raw = read_regular(path, MAX_OPENING_BYTES)
    except FileNotFoundError:
        raise _Refused("the executor did not open it") from None
    except (OSError, HostileFile) as exc:
        raise _Refused(f"its opening is refused: {exc}") from None
    try:
        found = json.loads(raw)
        w, r = found["weights"], found["rest"]
        w_digest, w_len, r_digest, r_len = str(w["digest"]), int(w["length"]), str(r["digest"]), int(r["length"])
        trace_digest, leaf_proof, chunks = str(found["trace_digest"]), list(found["leaf_proof"]), list(found["chunks"])
    except (ValueError, KeyError, TypeError) as exc:
        raise _Refused(f"its opening is malformed ({type(exc).__name__})") from None
    if w_len != weights_length:
        raise _Refused(f"its weights file is {w_len} bytes, not the {weights_length} of the spec model")
    if not 0 <= r_len <= (max_rest if max_rest is not None else MAX_REST_BYTES):
        raise _Refused(f"its rest file is {r_len} bytes, more than this job's layout allows")
    try:
        leaf = leaf_of(w_digest, rest_of(r_digest, trace_digest))
        check_leaf(commitment, b, leaf, [str(p) for p in leaf_proof])
    except Exception as exc:  # noqa: BLE001 — malformed hex, or a leaf not under the root
        raise _Refused(f"its digests do not match leaf {b} of the committed root ({exc})") from None
    weights: dict[int, bytes] = {}
    rest: dict[int, bytes] = {}
    size = 0
    for item in chunks:
        try:
            name, j, data, proof = item["file"], int(item["index"]), base64.b64decode(item["data"], validate=True), item["proof"]
        except (ValueError, KeyError, TypeError) as exc:
            raise _Refused(f"a chunk of its opening is malformed ({type(exc).__name__})") from None
        digest, length, into = (w_digest, w_len, weights) if name == "weights" else (r_digest, r_len, rest) if name == "rest" else (None, 0, None)
        if into is None or not verify_chunk(data, j, length, proof, digest):
            raise _Refused(f"{name} chunk {j} does not match its committed digest")
        into[j] = data
        size += len(data)
    header_end = min(r_len, 8 + min(_header_len(rest), HEADER_LIMIT))
    header = b"".join(rest.get(j, b"") for j in range(chunk_count(header_end)))
    try:
        layout = Layout.parse(header, r_len) if r_len else None
    except CanonicalError as exc:
        raise _Refused(f"the rest's header is not canonical: {exc}") from None
    got = _Opened(weights, rest, layout)
    w_want, r_want = wanted_chunks(b, commitment.n, draws, chunk_count(w_len), layout) if layout else ([], [])
    if missing := [f"weights:{j}" for j in w_want if j not in weights] + [f"rest:{j}" for j in r_want if j not in rest]:
        raise _Refused(f"the drawn chunks {', '.join(missing[:5])} are not opened")
    return got, [f"weights:{j}" for j in sorted(weights)] + [f"rest:{j}" for j in sorted(rest)], size


def _header_len(rest: Mapping[int, bytes]) -> int:
    first = rest.get(0, b"")
    return int.from_bytes(first[:8], "little") if len(first) >= 8 else 0


def _value(opened: _Opened, name: str) -> torch.Tensor | None:
    if opened.rest_layout is None or name not in opened.rest_layout.entries:
        return None
    found = opened.rest_layout.values(name, opened.rest)
    return found[1] if found is not None and found[0] == 0 and found[1].numel() == math.prod(opened.rest_layout.entries[name][1]) else None


def _exact(b: int, got: _Opened, spec: Spec, reasons: list[str]) -> list[Measurement]:
    out = []
    wanted = {
        "runtime/step": (lambda t: int(t.view(torch.int64).item()) if t.numel() == 1 else None, b * spec.k),
        "runtime/seed": (lambda t: int(t.view(torch.int64).item()) if t.numel() == 1 else None, spec.seed),
        "runtime/recipe.json": (lambda t: bytes(t.numpy().tobytes()), spec.recipe_json),
        "runtime/config.json": (lambda t: bytes(t.numpy().tobytes()), spec.config_json),
    }
    for name, (read, expected) in wanted.items():
        value = _value(got, name)
        measured = None if value is None else read(value)
        ok = measured == expected
        shown = measured.decode("ascii", "replace")[:60] if isinstance(measured, bytes) else measured
        out.append(Measurement(check=f"exact {name}", at=b, measured=shown, bound=f"= {expected!r}"[:80], passed=ok))
        if not ok:
            reasons.append(f"boundary {b}: {name} is {shown!r}, the spec's is {expected!r}"[:200])
    if got.rest_layout is not None and "runtime/world_size" in got.rest_layout.entries:
        reasons.append(f"boundary {b}: it records runtime/world_size (a run of several processes)")
    return out


def _adam(spec: Spec) -> tuple[float, float, float, float] | None:
    """(lr, β₂, R(β), wd) over every group, the most permissive; None unless every group has betas."""
    groups = spec.groups
    if not groups or any(not isinstance(g.get("betas"), list) for g in groups):
        return None
    lr = max(float(g.get("lr", 0)) for g in groups)
    beta2 = min(float(g["betas"][1]) for g in groups)
    r = max(_ratio_bound(float(g["betas"][0]), float(g["betas"][1])) for g in groups)
    wd = max(float(g.get("weight_decay", 0) or 0) for g in groups)
    return (lr, beta2, r, wd) if math.isfinite(r) and lr > 0 else None


def _ratio_bound(beta1: float, beta2: float) -> float:
    """R(β) = max over t of C(β)·√(1 − β₂^t)/(1 − β₁^t): the largest bias-corrected |m̂|/√v̂."""
    c = moment_bound(beta1, beta2)
    if not math.isfinite(c):
        return math.inf
    best, t = 0.0, 1
    while t < 10**7:
        best = max(best, c * math.sqrt(1 - beta2**t) / (1 - beta1**t))
        t = t + 1 if t < 1000 else t * 2
    return max(best, c)


def _counter(got: _Opened) -> dict[str, float]:
    out = {}
    if got.rest_layout is None:
        return out
    for name in got.rest_layout.exact_entries():
        if name.endswith("/step") and "/state/" in name and (v := _value(got, name)) is not None and v.numel() == 1:
            out[name.split("/state/")[0]] = float(v.double().item())
    return out


def _segments(n: int, opened: Sequence[_Opened], draws, spec: Spec, reasons: list[str]) -> list[Measurement]:
    out: list[Measurement] = []
    adam = _adam(spec)
    counters = [_counter(o) for o in opened]
    movement: list[float | None] = []
    steps_taken: list[float | None] = []
    for s in range(n):
        before, after = opened[s], opened[s + 1]
        steps = None
        if counters[s + 1]:
            steps = max(counters[s + 1].values()) - max(counters[s].values(), default=0.0)
            if steps < 0:
                reasons.append(f"segment {s}: the optimizer's step counter went back by {-steps:g}")
            out.append(Measurement(check="optimizer steps", at=s, measured=steps, bound="≥ 0", passed=steps >= 0))
        t = max(steps, 0.0) if steps is not None else spec.k
        moved, worst, limit_hit = [], 0.0, None
        for j in sorted(set(draws[s].weights)):
            if j not in before.weights or j not in after.weights:
                continue
            for name, w0, w1 in _float_pairs(spec.weights_layout, j, before.weights, after.weights):
                delta = (w1.double() - w0.double()).abs()
                moved.append(float(delta.pow(2).sum()))
                if adam is not None:
                    lr, _, r, wd = adam
                    allowed = t * lr * (r + wd * torch.maximum(w0.double().abs(), w1.double().abs())) * MOVE_SLACK + 1e-12
                    excess = float((delta / allowed).max()) if delta.numel() else 0.0
                    if excess > worst:
                        worst, limit_hit = excess, name
        norm = math.sqrt(sum(moved)) if moved else None
        movement.append(norm)
        steps_taken.append(steps)
        if adam is not None:
            ok = worst <= 1.0
            out.append(Measurement(check="weight movement / k-step bound", at=s, measured=worst,
                                   bound=f"≤ 1 (t = {t:g} steps at lr {adam[0]:g}, R = {adam[2]:.3g})", passed=ok))
            if not ok:
                reasons.append(f"segment {s}: {limit_hit} moved {worst:.3g}× what {t:g} optimizer steps at lr {adam[0]:g} allow")
            if s >= 1:
                out.append(_moments(s, before, after, adam[1], t, reasons))
    out += _profile(movement, steps_taken, reasons)
    return out


def _float_pairs(layout: Layout, j: int, before: Mapping[int, bytes], after: Mapping[int, bytes]):
    for name, (dtype, _, begin, end) in layout.entries.items():
        if not dtype.is_floating_point or end <= j * CHUNK_BYTES or begin >= (j + 1) * CHUNK_BYTES:
            continue
        a = layout.values(name, {j: before[j]})
        z = layout.values(name, {j: after[j]})
        if a is not None and z is not None and a[0] == z[0] and a[1].numel() == z[1].numel():
            yield name, a[1].reshape(-1), z[1].reshape(-1)


def _moments(s: int, before: _Opened, after: _Opened, beta2: float, t: float, reasons: list[str]) -> Measurement:
    floor_factor = beta2**t
    worst, compared = math.inf, 0
    if before.rest_layout is not None and after.rest_layout is not None:
        for name in before.rest_layout.entries:
            if not name.endswith("/exp_avg_sq") or name not in after.rest_layout.entries:
                continue
            a, z = before.rest_layout.values(name, before.rest), after.rest_layout.values(name, after.rest)
            if a is None or z is None:
                continue
            lo, hi = max(a[0], z[0]), min(a[0] + a[1].numel(), z[0] + z[1].numel())
            if hi <= lo:
                continue
            va = a[1].reshape(-1)[lo - a[0] : hi - a[0]].double()
            vz = z[1].reshape(-1)[lo - z[0] : hi - z[0]].double()
            mask = va > 0
            compared += int(mask.sum())
            if bool(mask.any()):
                worst = min(worst, float((vz[mask] / va[mask]).min()))
    ok = compared == 0 or worst >= floor_factor * (1 - V_SLACK)
    if not ok:
        reasons.append(f"segment {s}: second moments fell to {worst:.3g}× in {t:g} steps, below β₂^t = {floor_factor:.3g}")
    return Measurement(check="second moments v_{s+1}/v_s", at=s, measured=None if compared == 0 else worst,
                       bound=f"≥ β₂^t = {floor_factor:.4g} ({compared} elements)", passed=ok)


def _profile(movement: Sequence[float | None], steps: Sequence[float | None], reasons: list[str]) -> list[Measurement]:
    """Movement per optimizer step (when the counters say how many) against the neighbours'. A segment
    without optimizer steps is compared only where every neighbour has some (a regular schedule)."""
    out = []
    per_step = [None if m is None or t == 0 else (m / t if t else m) for m, t in zip(movement, steps, strict=True)]
    for s, m in enumerate(movement):
        if m is None:
            continue
        window = list(range(max(0, s - WINDOW), s)) + list(range(s + 1, min(len(movement), s + 1 + WINDOW)))
        if steps[s] == 0:
            if window and s - WINDOW >= 0 and s + WINDOW < len(movement) and all(steps[i] and steps[i] > 0 for i in window):
                out.append(Measurement(check="movement profile", at=s, measured=0.0,
                                       bound="optimizer steps as every neighbour's", passed=False))
                reasons.append(f"segment {s}: no optimizer step where every neighbouring segment has some (a freeze)")
            continue
        m = per_step[s]
        left = [x for x in per_step[max(0, s - WINDOW) : s] if x is not None]
        right = [x for x in per_step[s + 1 : s + 1 + WINDOW] if x is not None]
        if not left or not right:  # an edge: replayed anyway (segment 0, the last L), and a schedule's ramp
            continue                # is one-sided there
        sides = [statistics.median(left), statistics.median(right)]
        if min(sides) <= 0:  # idle segments around it (updates every few segments, learning not started)
            continue
        low = all(m < med / PROFILE_FACTOR for med in sides)
        high = all(m > med * PROFILE_FACTOR for med in sides)
        ratio = m / min(sides) if min(sides) > 0 else None
        out.append(Measurement(check="movement profile", at=s, measured=ratio,
                               bound=f"within 1/{PROFILE_FACTOR:g}..{PROFILE_FACTOR:g}× its neighbours", passed=not (low or high)))
        if low or high:
            reasons.append(f"segment {s}: its weights moved {ratio or 0:.3g}× as much as its neighbours' (a "
                           f"{'freeze' if low else 'jump'}), outside 1/{PROFILE_FACTOR:g}..{PROFILE_FACTOR:g}")
    return out


def spec_of(job, initial_state, max_rest_bytes: int | None = None) -> Spec:
    """The :class:`Spec` of an audited job from the broker's own S_0 (its weights' layout, optimizer groups)."""
    from trainmaster.jobs.state import json_tensor

    groups: list[dict[str, Any]] = []
    for name, tensor in initial_state.rest.items():
        if name.endswith("/param_groups.json"):
            value = tensor_json(tensor)
            groups += [g for g in value if isinstance(g, dict)] if isinstance(value, list) else []
    recipe_json = bytes(json_tensor(job.recipe.name).numpy().tobytes())
    config_json = bytes(json_tensor(job.config).numpy().tobytes())
    return Spec(k=job.k, seed=job.seed, recipe_json=recipe_json, config_json=config_json,
                weights_layout=Layout.of(initial_state.weights), groups=groups, max_rest_bytes=max_rest_bytes)

"""Trust at scale: what chunked leaves, keep_every and the sampled tier cost and catch.

Figures (CPU, this shared 2-core VM; `run(smoke=True)` shrinks every size):

* **Disk per 1,000 steps** at k = 25 for a ~100M-parameter AdamW model (weights + two moments: one state
  is 1.2 GB), every state kept (today) against ``keep_every: 40``. Measured on a smaller model: a tiny-LM
  run with m = 40 whose bytes on disk are counted, divided by its one state's bytes to give states kept,
  then scaled to the 100M model's state size (the count of states kept does not depend on the model).
  Reported for a 1,000-step run (S_0, S_39, S_40 kept: the ends dominate) and in the steady state of a
  long run (one state per 40 segments).
* **Checkpoint + hash time** (``write_segment``: canonical bytes, chunk digests on a thread pool beside the
  write, fsync, publish) against ``safetensors.torch.save_file`` of the same tensors: the median
  of the per-round ratios of 9 paired rounds whose order alternates (this VM is shared), a 100M-parameter
  AdamW-like state (weights and two moments: 1.2 GB; ``--ckpt-params=25e6`` for a smaller one; smoke 1M,
  2 rounds). Also against ``save_file`` + fsync, the floor no hash can remove (the same bytes written and
  fsynced, unhashed, against the bare ``save_file``), and the CPU seconds of both (all threads), which a
  loaded machine rations: where other processes hold the cores, the wall-clock ratio tends to the CPU one.
* **Seconds to open a dropped state** against m: ``jobs.reopen`` re-making S_{m−1} from kept S_0
  (the worst case of a state m − 1 segments past a kept one), tiny LM at k = 25.
* **Detection per attack and tier**, at n = 20 and n = 400, *computed analytically* from per-boundary
  detection rates measured here: a freeze, a swap and a backdoor written at boundary 30 of an n = 60
  tiny-LM run, each checked under 10 challenges whose replayed segments avoid segment 29 (so only the
  boundary checks can catch it); with p_b that rate, the sampled tier catches it with probability
  ``1 − (1 − q/(n−2))·(1 − p_b)`` (q = 8; segment j−1 replayed, or the boundary check), the replay-only
  tier with ``q/(n−2)``. Within-τ poisoning and lr × 0.99 stay inside every bound the boundary checks
  apply (p_b = 0 by construction) and inside τ: neither tier catches them; that is the refereed tier's
  job (below). Skipped work is the replay's (docs/protocol.md §7).
* **False rejects**: honest runs of each shipped recipe (tiny-lm, dqn, ppo; 3 seeds, n = 20 each),
  every one checked under 100 challenges (300 audits per recipe; smoke: 1 seed, 2 challenges) with
  every boundary check on. Target: 0.
* **Extra compute** of the sampled tier's boundary checks as a share of the run's training time, and
  **bytes opened per boundary**.
* **The refereed tier** (``--only=referee``), *measured* end to end below the network: an honest tiny-LM run and
  an attacked one of the same seed, at n = 20 and n = 400 (k = 2), bisected over the miners' own leaf openings
  (``backends.segments.leaf_openings``, each checked against its root) to the first differing leaf, the agreed
  state opened as the miner's challenge route would send it, and the one segment replayed
  (``verify.referee_replay``). Attacks: a freeze, a swap and a backdoor at one interior boundary, within-τ poisoning
  (every boundary's weights pushed by 1e-7), lr × 0.99 and skipped work (the second half's states copies of the
  last trained one). Caught = the attacker refuted and the honest run upheld: 1 for every attack (the tier needs
  both miners to collude to pass a cheat). Compute: the two runs plus the referee (the bisection's openings and
  checks, both sides' work, and the one replayed segment with the trainer it builds), in units of one run; bytes
  downloaded per dispute: both sides' leaf openings plus the agreed state's opening (S_{j−1} and S_j in full
  and every segment's manifest, as the challenge route sends them).

Run: python tests/benchmarks/bench_trust.py
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from trainmaster.jobs.boundary_chunks import write_openings
from trainmaster.jobs.canonical import views
from trainmaster.jobs.checkpoint import read_segment, segment_dir, write_segment
from trainmaster.jobs.commitment import build_commitment
from trainmaster.jobs.decisions import DecisionLog, DecisionTrace
from trainmaster.jobs.execution import build_trainer, full_state, restore, run_step
from trainmaster.jobs.recipes import get_recipe
from trainmaster.jobs.reopen import reopen
from trainmaster.jobs.runtime import run as run_job
from trainmaster.jobs.settings import RuntimeSettings
from trainmaster.jobs.state import TrainState
from trainmaster.verify.boundaries import check_boundaries, spec_of
from trainmaster.verify.recipe_run import RecipeRun

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent))
from _common import print_figures  # noqa: E402
from tampered_runs import continue_from  # noqa: E402

LM = get_recipe("tiny-lm")
SMALL = {"d_model": 16, "heads": 2, "seq_len": 8, "batch_size": 2}
STATE_100M = 100e6 * 4 * 3  # fp32 weights and two AdamW moments
CHECKPOINT_PARAMS = int(float(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--ckpt-params=")), "100e6")))
CHECKPOINT_ROUNDS = int(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--ckpt-rounds=")), "9"))


def _train(root: Path, steps: int, k: int, seed: int = 5, keep_every: int = 1, config=SMALL):
    settings = RuntimeSettings(job_id="b", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=seed,
                               segment_steps=k, bundle_sha256="0" * 64, keep_every=keep_every)
    started = time.perf_counter()
    commitment = run_job(LM, LM.config({"steps": steps, **config}), settings).commitment
    return commitment, time.perf_counter() - started


def _disk(root: Path) -> int:
    return sum(f.stat().st_size for f in (root / "ckpt" / "segments").rglob("*.safetensors"))


def disk_figures(tmp: Path, smoke: bool) -> dict[str, float]:
    k, m = 25, 40
    steps = 1000 if not smoke else 200
    every, _ = _train(tmp / "every", steps, k)
    few, _ = _train(tmp / "few", steps, k, keep_every=m if not smoke else 4)
    one_state = _disk(tmp / "every") / (steps // k + 1)
    kept_states = _disk(tmp / "few") / one_state
    n = steps // k
    steady = (n / m)  # states kept per 1,000 steps in a long run: one every m segments
    return {
        "states kept per 1000 steps, every state": n + 1,
        "states kept per 1000 steps, m=40 (1000-step run)": round(kept_states, 2),
        "disk GB per 1000 steps, 100M AdamW, every state": (n + 1) * STATE_100M / 1e9,
        "disk GB per 1000 steps, 100M AdamW, m=40, 1000-step run": kept_states * STATE_100M / 1e9,
        "disk GB per 1000 steps, 100M AdamW, m=40, steady state": steady * STATE_100M / 1e9,
        "disk reduction, 1000-step run (x)": (n + 1) / kept_states,
        "disk reduction, steady state (x)": (n + 1) / steady,
    }


_CPU: list[float] = []
"""The process CPU seconds of each :func:`_timed` call, in order (all threads: the hashing pool's too)."""


def _timed(fn) -> float:
    cpu, started = time.process_time(), time.perf_counter()
    fn()
    seconds = time.perf_counter() - started
    _CPU.append(time.process_time() - cpu)
    return seconds


def _sync(*paths: Path) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def checkpoint_figures(tmp: Path, smoke: bool) -> dict[str, float]:
    """``write_segment`` against a bare ``save_file`` of the same tensors, in paired rounds whose order alternates
    (the machine is shared: a ratio per round, then the median). Every file is fsynced and removed after its
    timing, so one side's writeback never lands in the other's. Also against ``save_file`` + fsync (the runtime's
    checkpoints are durable), and the part that is not hashing: the same bytes written and fsynced, unhashed."""
    params = 1_000_000 if smoke else CHECKPOINT_PARAMS
    rounds = 2 if smoke else CHECKPOINT_ROUNDS
    generator = torch.Generator().manual_seed(0)
    weights = {f"layer{i}": torch.randn(params // 10, generator=generator) for i in range(10)}
    rest = {f"opt/state/{i}/{key}": torch.rand(params // 10, generator=generator)
            for i in range(10) for key in ("exp_avg", "exp_avg_sq")}
    files, canonical = [tmp / "w.safetensors", tmp / "r.safetensors"], [views(weights), views(rest)]

    def ours(round_: int) -> float:
        target = tmp / f"ck{round_}"
        seconds = _timed(lambda: write_segment(target, 0, TrainState(weights, rest), {}, job_id="b", recipe="x",
                                               step=0, k=1))
        shutil.rmtree(target)
        return seconds

    def bare(durable: bool) -> float:
        def save():
            save_file(weights, str(files[0]))
            save_file(rest, str(files[1]))
            if durable:
                _sync(*files)
        seconds = _timed(save)
        _sync(*files)
        for path in files:
            path.unlink()
        return seconds

    def unhashed() -> float:
        def write():
            for path, parts in zip(files, canonical, strict=True):
                with open(path, "wb") as handle:
                    for part in parts:
                        handle.write(part)
            _sync(*files)
        seconds = _timed(write)
        for path in files:
            path.unlink()
        return seconds

    ratios, durable_ratios, floor_ratios, ours_s, bare_s, cpu_ratios = [], [], [], [], [], []
    for round_ in range(rounds + 1):  # round 0 warms the allocator and the page cache
        if round_ % 2:
            mine, plain, synced, written = ours(round_), bare(False), bare(True), unhashed()
            mine_cpu, plain_cpu = _CPU[-4], _CPU[-3]
        else:
            plain, synced, written, mine = bare(False), bare(True), unhashed(), ours(round_)
            mine_cpu, plain_cpu = _CPU[-1], _CPU[-4]
        if round_:
            cpu_ratios.append(mine_cpu / max(plain_cpu, 1e-9))
            ratios.append(mine / plain)
            durable_ratios.append(mine / synced)
            floor_ratios.append(written / plain)
            ours_s.append(mine)
            bare_s.append(plain)
    with open("/proc/loadavg") as handle:
        load = float(handle.read().split()[0])
    return {"checkpoint+hash s": statistics.median(ours_s), "bare save_file s": statistics.median(bare_s),
            "checkpoint+hash / save_file": statistics.median(ratios),
            "checkpoint+hash / (save_file + fsync)": statistics.median(durable_ratios),
            "floor: write + fsync, no hash / save_file": statistics.median(floor_ratios),
            "checkpoint+hash CPU s / save_file CPU s": statistics.median(cpu_ratios),
            "checkpoint rounds": rounds, "state MB": 3 * params * 4 / 1e6, "load average (1 min)": load}


def reopen_figures(tmp: Path, smoke: bool) -> dict[str, float]:
    k, figures = 25, {}
    for m in ([2, 4] if smoke else [5, 10, 20, 40]):
        root = tmp / f"m{m}"
        _train(root, k * (m + 2), k, keep_every=m)
        started = time.perf_counter()
        reopen(LM, root / "ckpt", [m - 1])
        figures[f"open S_{m - 1} (m={m}) s"] = time.perf_counter() - started
    return figures


def _continue(root: Path, state: TrainState, j: int, n: int, k: int, seed: int, record_environment: bool = False):
    return continue_from(root / "ckpt", LM, LM.config({"steps": n * k, **SMALL}), state, j, n=n, k=k, seed=seed,
                         job_id="b", record_environment=record_environment)


def detection_figures(tmp: Path, smoke: bool) -> dict[str, float]:
    n, k, j, seed = (20, 2, 10, 5) if smoke else (60, 2, 30, 5)
    trials = 2 if smoke else 10
    honest, train_s = _train(tmp / "h", n * k, k, seed=seed)
    _train(tmp / "o", n * k, k, seed=seed + 1)
    cfg = LM.config({"steps": n * k, **SMALL})
    spec = spec_of(RecipeRun(LM, cfg.model_dump(mode="json"), seed, k), full_state(build_trainer(LM, cfg, seed), LM, cfg, seed, 0))
    state_j = read_segment(segment_dir(tmp / "h" / "ckpt", j)).state

    def freeze():
        before = read_segment(segment_dir(tmp / "h" / "ckpt", j - 1)).state
        rest = dict(before.rest)
        for name, t in state_j.rest.items():
            if name == "runtime/step" or (name.endswith("/step") and "/state/" in name):
                rest[name] = t.clone()
        return TrainState(dict(before.weights), rest)

    def swap():
        return TrainState(dict(read_segment(segment_dir(tmp / "o" / "ckpt", j)).state.weights), dict(state_j.rest))

    def backdoor():
        trainer = build_trainer(LM, cfg, seed)
        restore(trainer, state_j)
        opt = torch.optim.AdamW(trainer.model.parameters(), lr=cfg.lr)
        for _ in range(100):
            tokens = torch.randint(0, cfg.vocab, (8, cfg.seq_len))
            tokens[:, -1] = 3
            loss = F.cross_entropy(trainer.model(tokens)[:, -1], torch.zeros(8, dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
        tuned = {name: t.detach().clone() for name, t in trainer.model.state_dict().items() if name in state_j.weights}
        return TrainState({**state_j.weights, **tuned}, dict(state_j.rest))

    rng = random.Random(1)
    figures: dict[str, float] = {}
    pool = [i for i in range(1, n - 1) if i != j - 1]
    check_s, opened = [], []
    for name, make in (("freeze", freeze), ("swap", swap), ("backdoor", backdoor)):
        root = tmp / name
        shutil.copytree(tmp / "h" / "ckpt", root / "ckpt")
        commitment = _continue(root, make(), j, n, k, seed)
        caught = 0
        for _ in range(trials):
            segments = sorted({0, n - 1, *rng.sample(pool, min(8, len(pool)))})
            shutil.rmtree(root / "opened", ignore_errors=True)
            write_openings(root / "ckpt", segments, root / "opened")
            started = time.perf_counter()
            report = check_boundaries(commitment, root / "opened", segments, spec)
            check_s.append(time.perf_counter() - started)
            opened.append(report.bytes_opened / (n + 1))
            caught += any(r.startswith(f"segment {j - 1}:") for r in report.reasons)
        p_b = caught / trials
        figures[f"{name}: per-boundary detection (measured)"] = p_b
        for size in (20, 400):
            q = 8
            replay = min(1.0, q / (size - 2))
            figures[f"{name}: caught at n={size}, replay tier"] = replay
            figures[f"{name}: caught at n={size}, sampled tier"] = 1 - (1 - replay) * (1 - p_b)
    for name in ("within-tau poisoning", "lr x 0.99"):
        for size in (20, 400):
            figures[f"{name}: caught at n={size}, sampled tier (analytic: inside every bound)"] = 0.0
    # the refereed tier's rows are measured in referee_figures (--only=referee)
    figures["boundary checks s per run (n boundaries)"] = statistics.median(check_s)
    figures["boundary checks / training time"] = statistics.median(check_s) / train_s
    figures["boundary check ms per boundary"] = 1000 * statistics.median(check_s) / (n + 1)
    figures["bytes opened per boundary"] = statistics.median(opened)
    return figures


def _attacked(root: Path, honest: Path, n: int, k: int, seed: int, kind: str):
    """A run of the same job and seed altered by `kind`, written like the runtime's (segments and commitment)."""
    cfg = LM.config({"steps": n * k, **SMALL})
    j = n // 2
    if kind in ("freeze", "swap", "backdoor"):
        shutil.copytree(honest / "ckpt", root / "ckpt")
        for stale in range(j, n + 1):
            shutil.rmtree(segment_dir(root / "ckpt", stale))
        state = read_segment(segment_dir(honest / "ckpt", j)).state
        before = read_segment(segment_dir(honest / "ckpt", j - 1)).state
        if kind == "freeze":
            rest = dict(before.rest)
            rest.update({name: t.clone() for name, t in state.rest.items()
                         if name == "runtime/step" or (name.endswith("/step") and "/state/" in name)})
            state = TrainState(dict(before.weights), rest)
        elif kind == "swap":
            state = TrainState({name: t.flip(0) if t.dim() else t for name, t in state.weights.items()}, dict(state.rest))
        else:
            state = TrainState({name: t + 0.01 * torch.randn_like(t) for name, t in state.weights.items()},
                               dict(state.rest))
        return _continue(root, state, j, n, k, seed, record_environment=True)
    trainer = build_trainer(LM, cfg, seed)
    if kind == "lr x 0.99":
        scheduled = trainer.lr_at
        trainer.lr_at = lambda step: 0.99 * scheduled(step)
    current = full_state(trainer, LM, cfg, seed, 0).snapshot()
    for i in range(n + 1):
        log = DecisionLog()
        if i < n:
            for step in range(i * k, (i + 1) * k):
                if not (kind == "skipped work" and i >= j):
                    run_step(trainer, seed, step, log)
        write_segment(root / "ckpt", i, current, (log.trace if i < n else DecisionTrace()).to_tensors(),
                      job_id="b", recipe=LM.name, step=i * k, k=k)
        if i < n:
            current = full_state(trainer, LM, cfg, seed, (i + 1) * k).snapshot()
            if kind == "within-tau poisoning":
                pushed = {name: t + 1e-7 * torch.sign(t) for name, t in current.weights.items()}
                restore(trainer, TrainState(pushed, dict(current.rest)))
                current = full_state(trainer, LM, cfg, seed, (i + 1) * k).snapshot()
    return build_commitment(root / "ckpt", job_id="b", bundle_sha256="0" * 64, n=n, k=k, record_environment=True)


def referee_figures(tmp: Path, smoke: bool) -> dict[str, float]:
    import asyncio
    import json

    from trainmaster.backends.segments import copy_segments, leaf_openings
    from trainmaster.jobs.spec import JobSpec
    from trainmaster.verify.referee import Bisection, check_opening, dispute, judge
    from trainmaster.verify.referee_replay import DisputeReplay, replay_dispute

    k, seed, figures = 2, 5, {}
    attacks = ("freeze", "swap", "backdoor", "within-tau poisoning", "lr x 0.99", "skipped work")
    for n in ([20] if smoke else [20, 400]):
        honest, train_s = _train(tmp / f"h{n}", n * k, k, seed=seed)
        options = " ".join(f"--{key.replace('_', '-')} {value}" for key, value in SMALL.items())
        spec = JobSpec(name="lm", entrypoint=f"python -m trainmaster.jobs.recipes.tiny_lm --steps {n * k} {options}",
                       seed=seed, checkpoint={"segment_steps": k})
        for kind in (attacks[::2] if smoke else attacks):
            root = tmp / f"{kind.replace(' ', '-')}{n}"
            bad = _attacked(root, tmp / f"h{n}", n, k, seed, kind)
            started = time.perf_counter()
            bisection, leaf_bytes = Bisection(n + 1), 0
            while not bisection.done or bisection.needed():
                for i in ([bisection.probe()] if not bisection.done else bisection.needed()):
                    a, b = leaf_openings(tmp / f"h{n}" / "ckpt", [i])[0], leaf_openings(root / "ckpt", [i])[0]
                    leaf_bytes += len(json.dumps(a)) + len(json.dumps(b))
                    bisection.record(i, check_opening(honest.root, n + 1, i, a), check_opening(bad.root, n + 1, i, b))
            found = dispute(bisection.first_differing, *bisection.opened[bisection.first_differing])
            opened = tmp / "opened"
            shutil.rmtree(opened, ignore_errors=True)
            state_bytes = 0
            if found.compared != "initial":  # the attacker opens the agreed state: it cannot change what it is
                asyncio.run(copy_segments(root / "ckpt", [found.opened_state], opened, boundaries=False))
                state_bytes = sum(f.stat().st_size for f in opened.rglob("*") if f.is_file())
            replayed = replay_dispute(DisputeReplay(
                spec_json=spec.model_dump_json(), seed=seed, compared=found.compared, segment=found.segment,
                opened_state=found.opened_state, commitment=bad.canonical_json(), openings_dir=str(opened)))
            referee_s = time.perf_counter() - started
            sides = {"honest": bisection.opened[found.leaf][0], "attacker": bisection.opened[found.leaf][1]}
            ruled = judge(found.compared, replayed, sides) if "failed" not in replayed else {}
            caught = ruled == {"honest": "upheld", "attacker": "refuted"}
            figures[f"{kind}: caught at n={n}, refereed tier"] = float(caught)
            figures[f"{kind}: refereed compute at n={n} (x one run: two runs + the referee)"] = 2 + referee_s / train_s
            figures[f"{kind}: bytes downloaded per dispute at n={n}"] = leaf_bytes + state_bytes
            figures[f"{kind}: leaves opened per side at n={n}"] = len(bisection.opened)
    return figures


HONEST = {
    "tiny-lm": ({"steps": 500, **SMALL}, 25),
    "dqn": ({"steps": 2000}, 100),
    "ppo": ({"steps": 2560}, 128),
}


def false_reject_figures(tmp: Path, smoke: bool) -> dict[str, float]:
    figures = {}
    rng = random.Random(7)
    for name, (config, k) in HONEST.items():
        recipe = get_recipe(name)
        cfg = recipe.config(config)
        audits = rejected = 0
        for seed in ([1] if smoke else [1, 2, 3]):
            root = tmp / f"{name}-{seed}"
            settings = RuntimeSettings(job_id="h", output_dir=root / "out", checkpoint_dir=root / "ckpt", seed=seed,
                                       segment_steps=k, bundle_sha256="0" * 64)
            commitment = run_job(recipe, cfg, settings).commitment
            spec = spec_of(RecipeRun(recipe, cfg.model_dump(mode="json"), seed, k),
                           full_state(build_trainer(recipe, cfg, seed), recipe, cfg, seed, 0))
            n = commitment.n
            for _ in range(2 if smoke else 100):
                segments = sorted({0, n - 1, *rng.sample(range(1, n - 1), min(8, n - 2))})
                shutil.rmtree(root / "opened", ignore_errors=True)
                write_openings(root / "ckpt", segments, root / "opened")
                report = check_boundaries(commitment, root / "opened", segments, spec)
                audits += 1
                rejected += not report.passed
        figures[f"{name}: honest audits"] = audits
        figures[f"{name}: false rejects"] = rejected
    return figures


def run(smoke: bool = False) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-trust-") as scratch:
        tmp = Path(scratch)
        figures = {}
        parts = (("disk", disk_figures), ("ckpt", checkpoint_figures), ("reopen", reopen_figures),
                 ("detect", detection_figures), ("honest", false_reject_figures), ("referee", referee_figures))
        only = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--only=")]
        for part, fn in parts:
            if only and part not in only:
                continue
            (tmp / part).mkdir()
            figures.update(fn(tmp / part, smoke))
    print_figures("trust at scale", figures, {"checkpoint+hash / save_file": "<= 1.5",
                                             "disk reduction, steady state (x)": ">= 20",
                                             "boundary checks / training time": "<= 0.05"})
    return figures


if __name__ == "__main__":
    run(smoke="--smoke" in sys.argv)

"""The GPU check: the audited GPU path end to end, in one go, on a machine with a CUDA device.

Run by ``./dev gpu-check`` (tests/gpu/check.sh installs trainmaster over the machine's own torch first).
Within a time budget (default 510 s), in order of importance, each stage skipped with the reason when
too little time is left, every result written to ``$OUT/gpu-check.json`` as it comes:

1. ``environment`` — torch, CUDA, the GPU;
2. ``gpt_submit`` — an 86M-parameter GPT-style recipe of the job's own (tests/gpu/gpt_job: d 768,
   12 layers, seq 256, batch 32, k = 25) on CUDA through ``trainmaster submit --wait`` with
   ``replay_audit: always``: trains, self-checks in a fresh process on the GPU (the false alarm of
   issue #30), commits ``device: cuda``, and the broker replays every segment bit for bit on the GPU;
3. ``gpt_benchmark`` — the same model in process: a bare loop against ``runtime.run`` (self-check off),
   the fraction of step time the loop is blocked by checkpoints;
4. ``gpt_resume`` — the recipe killed with SIGKILL after segment 2 and resumed: the same final weights
   as the uninterrupted run of stage 3;
5. ``shipped_submits`` — tiny-lm, DQN and PPO on CUDA through ``submit --wait``, audited on the GPU;
6. ``cpu_audits`` — every segment of those runs audited on the CPU (cuda→cpu, the shipped calibration;
   a direct run of the runtime when a submit left none): honest cross-device r against τ, false rejects;
7. ``cross_device_audits`` — per shipped recipe, one direct GPU run of 300 segments, every segment audited
   on the CPU in parallel (the ≥ 300 honest cross-device audits per recipe of issue #30);
8. ``calibrations`` — the real cuda→cpu and cuda→cuda pairs measured for the shipped recipes (GPU
   executors, honest and the mildest cheat), written to ``$OUT/calibrations.tar``
   (``<job class>.cuda-cpu.json`` …: copy them into verify/calibrations/ or ``$TRAINMASTER_HOME/calibration``);
9. ``gpt_cpu_audit`` — one segment of the 86M run re-executed on the CPU: its r, and the audit's cost
   as a fraction of the run's GPU time;
10. ``gpt_calibration`` — the 86M model's own recipe calibrated cuda→cuda (one base state, k = 25): honest
    p99 r, the mildest cheat's r, their separation and τ, the calibration itself in the summary.

``--lanes 2`` runs stages 5–8 in a second process beside the others (on a GPU machine's many cores the two
halves fit one device lease); their results are merged into the one summary.

``--rehearse`` runs the same stages on the CPU with small sizes (tests/repo/test_gpu_check.py), so the
orchestration is tested where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from trainmaster.jobs.cpus import usable_cpus  # noqa: E402

CORES = usable_cpus()
"""The cores this process may run on (a container's share, where ``os.cpu_count()`` gives the host's)."""

HERE = Path(__file__).resolve().parent
GPT_DIR = HERE / "gpt_job"
K = 25


@dataclass(frozen=True)
class Sizes:
    device: str
    gpt: dict[str, object]
    gpt_steps: int
    gpt_bench_steps: int
    """The benchmark's T: long enough that its first captures (pinned memory allocated) and the final flush do not
    stand for every segment."""
    shipped_steps: dict[str, int]
    calibration_steps: dict[str, int]
    calibration_bases: int
    audit_segments: int
    """At most this many segments of each shipped run are audited on the CPU."""
    cross_device_target: int
    """Stage ``cross_device_audits``: segments of one direct GPU run per shipped recipe audited on the CPU."""


GPU = Sizes(
    device="cuda",
    gpt={"d-model": 768, "layers": 12, "heads": 12, "seq-len": 256, "batch-size": 32, "vocab": 512, "threads": 16},
    gpt_steps=100,
    gpt_bench_steps=200,
    shipped_steps={"tiny_lm": 800, "dqn": 2000, "ppo": 4000},
    calibration_steps={"tiny_lm": 400, "dqn": 2000, "ppo": 4000},
    calibration_bases=2,
    audit_segments=320,
    cross_device_target=300,
)
REHEARSAL = Sizes(
    device="cpu",
    gpt={"d-model": 32, "layers": 2, "heads": 4, "seq-len": 16, "batch-size": 4, "vocab": 16},
    gpt_steps=50,
    gpt_bench_steps=50,
    shipped_steps={"tiny_lm": 50, "dqn": 550, "ppo": 500},
    calibration_steps={"tiny_lm": 50, "dqn": 600, "ppo": 600},
    calibration_bases=1,
    audit_segments=3,
    cross_device_target=4,
)
RECIPES = {"tiny_lm": "tiny-lm", "dqn": "dqn", "ppo": "ppo"}


@dataclass
class Check:
    out: Path
    work: Path
    sizes: Sizes
    budget_s: float
    started: float = field(default_factory=time.monotonic)
    summary: dict = field(default_factory=lambda: {"stages": {}, "figures": {}})
    found: dict = field(default_factory=dict)
    """What one stage leaves for another (a run's checkpoints, its final weights' sha256)."""
    recipes: dict = field(default_factory=lambda: dict(RECIPES))
    """The shipped recipes calibrated (module → name)."""
    run_recipes: dict = field(default_factory=lambda: dict(RECIPES))
    """The shipped recipes submitted and audited on the CPU."""

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def say(self, line: str) -> None:
        print(f"[gpu-check {time.monotonic() - self.started:6.1f} s] {line}", flush=True)

    def stage(self, name: str, need_s: float, run) -> None:
        if self.left() < need_s:
            self.summary["stages"][name] = {"status": "skipped", "why": f"{self.left():.0f} s left, it needs ~{need_s:.0f} s"}
            self.say(f"{name}: skipped ({self.left():.0f} s left)")
            self.save()
            return
        self.say(f"{name}: start")
        began = time.monotonic()
        try:
            result = run()
            self.summary["stages"][name] = {"status": "ok", "seconds": round(time.monotonic() - began, 1), **(result or {})}
        except Exception as exc:  # noqa: BLE001 — every stage reports, the next still runs
            self.summary["stages"][name] = {"status": "failed", "seconds": round(time.monotonic() - began, 1),
                                            "error": f"{type(exc).__name__}: {exc}",
                                            "traceback": traceback.format_exc()[-3000:]}
        self.say(f"{name}: {self.summary['stages'][name]['status']} ({time.monotonic() - began:.1f} s)")
        self.save()

    def save(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.started, 1)
        path = self.out / "gpu-check.json"
        path.with_name(path.name + ".tmp").write_text(json.dumps(self.summary, indent=2, sort_keys=True, default=str))
        os.replace(path.with_name(path.name + ".tmp"), path)

    # helpers

    def home(self) -> Path:
        """The check's own ``TRAINMASTER_HOME``; it keeps every segment of an accepted run (``retention.yaml``),
        since stage ``cpu_audits`` opens all of them after the broker's own audit is done."""
        home = self.work / "home"
        if not (home / "config" / "retention.yaml").is_file():
            (home / "config").mkdir(parents=True, exist_ok=True)
            (home / "config" / "retention.yaml").write_text("drop_accepted_segments: false\n")
        return home

    def cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess:
        env = {**os.environ, "TRAINMASTER_HOME": str(self.home()), "COLUMNS": "200"}
        return subprocess.run([sys.executable, "-m", "trainmaster.broker.cli", *args], capture_output=True, text=True,
                              env=env, timeout=timeout)

    def timeline(self, job_id: str) -> list[str]:
        """The job's events (``trainmaster status JOB --json``) as :func:`_timeline` lines; [] when it cannot be read."""
        try:
            shown = self.cli("status", job_id, "--json", timeout=60)
            return _timeline(json.loads(shown.stdout).get("events") or [])
        except (subprocess.TimeoutExpired, ValueError, AttributeError):
            return []

    def submit(self, job: Path, timeout: float) -> dict:
        """``trainmaster submit JOB --wait --json``: the job, its verdict's replay evidence, where its checkpoints are."""
        began = time.monotonic()
        done = self.cli("submit", str(job), "--wait", "--json", timeout=timeout)
        seconds = time.monotonic() - began
        try:
            finished = json.loads(done.stdout[done.stdout.index("{"):])
        except ValueError:
            raise RuntimeError(f"submit exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}") from None
        job_dir = self.home() / "jobs" / finished["id"]
        verdict = json.loads((job_dir / "verdict.json").read_text()) if (job_dir / "verdict.json").is_file() else {}
        replay = (verdict.get("evidence") or {}).get("replay") or {}
        commitments = sorted(job_dir.rglob("outputs/commitment.json"))
        checkpoints = sorted(p.parent.parent.parent for p in job_dir.rglob("segments/00000000/manifest.json"))
        return {
            "exit": done.returncode, "state": finished.get("state"), "reason": finished.get("reason"),
            "wall_s": round(seconds, 1), "verdict": verdict.get("outcome"), "checks": verdict.get("checks"),
            "replay": {key: replay.get(key) for key in ("passed", "device", "executor_device", "tau_source", "tau",
                                                         "calibration_pair", "replay_seconds", "reasons")},
            "replayed_segments": [s.get("index") for s in replay.get("segments", [])],
            "commitment": json.loads(commitments[0].read_text()) if commitments else None,
            "checkpoints": str(checkpoints[0]) if checkpoints else None,
            "log_tail": (done.stdout + done.stderr)[-1500:] if done.returncode else None,
            "job_log_tail": _job_log_tail(job_dir) if finished.get("state") != "accepted" else None,
            "timeline": self.timeline(finished["id"]),
        }


def _job_log_tail(job_dir: Path) -> str | None:
    """The end of what a failed job printed (its traceback): the attempts' log files, newest last."""
    logs = sorted((p for p in job_dir.rglob("*.log") if p.is_file()), key=lambda p: p.stat().st_mtime)
    return "\n".join(f"== {p.relative_to(job_dir)}\n{p.read_text(errors='replace')[-2500:]}" for p in logs[-3:]) or None


def _timeline(events: list[dict]) -> list[str]:
    """Where a submit's wall time went: each event's seconds since the first, its kind and the state it reached."""
    if not events:
        return []
    first = events[0].get("at") or 0.0
    return [f"{(e.get('at') or first) - first:8.1f} s  {e.get('kind')} {e.get('to') or ''}".rstrip() for e in events]


def direct_run(check: Check, module: str, steps: int, out: Path) -> tuple[Path, dict]:
    """A shipped recipe run by the runtime itself on this machine's device, as an executor runs it (no broker),
    into ``out``: its checkpoints and commitment, for the CPU audits."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "TRAINMASTER_OUTPUT_DIR": str(out), "TRAINMASTER_SEED": "7", "TRAINMASTER_SEGMENT_STEPS": str(K)}
    done = subprocess.run([sys.executable, "-m", f"trainmaster.jobs.recipes.{module}", "--steps", str(steps)], env=env,
                          capture_output=True, text=True, timeout=max(30.0, check.left() - 30), cwd=check.work)
    if done.returncode:
        raise RuntimeError(f"{module} exited {done.returncode}: {(done.stdout + done.stderr)[-2500:]}")
    return out / "checkpoints", json.loads((out / "commitment.json").read_text())


def gpt_options(sizes: Sizes, steps: int) -> list[str]:
    words = ["--steps", str(steps)]
    for key, value in sizes.gpt.items():
        words += [f"--{key}", str(value)]
    return words


def gpt_code(check: Check) -> Path:
    code = check.work / "gpt_job"
    if not code.exists():
        shutil.copytree(GPT_DIR, code, ignore=shutil.ignore_patterns("__pycache__", "job.yaml"))
    return code


def job_yaml(path: Path, *, name: str, entrypoint: str, recipe: str | None, gpus: int, seed: int) -> Path:
    lines = [f"name: {name}", f"entrypoint: {entrypoint}", *([f"recipe: {recipe}"] if recipe else []), f"seed: {seed}",
             f"checkpoint: {{segment_steps: {K}}}", f"resources: {{gpus: {gpus}, cpus: 2}}",
             "verification: {replay_audit: always}", "limits: {max_hours: 1}"]
    path.write_text("\n".join(lines) + "\n")
    return path


# stages


def environment(check: Check) -> dict:
    import trainmaster.jobs

    from trainmaster.jobs.devices import describe_device

    found = {"python": sys.version.split()[0], "trainmaster": str(Path(trainmaster.jobs.__file__).parent),
             "cpus": CORES, **describe_device(check.sizes.device)}
    check.summary["environment"] = found
    return found


def gpt_submit(check: Check) -> dict:
    code = gpt_code(check)
    job = job_yaml(code / "job.yaml", name="gpt86m", entrypoint="python gpt.py " + " ".join(gpt_options(check.sizes, check.sizes.gpt_steps)),
                   recipe="gpt:RECIPE", gpus=1 if check.sizes.device == "cuda" else 0, seed=1)
    result = check.submit(job, timeout=max(60.0, check.left() - 20))
    check.found["gpt_run"] = result
    check.summary["figures"]["gpt_submit_wall_s"] = result["wall_s"]
    return result


def gpt_benchmark(check: Check) -> dict:
    """tests/benchmarks/bench_gpt_blocked.py at this check's size: a bare loop against ``runtime.run``
    (self-check off), and the fraction of step time the loop is blocked by checkpoints."""
    sys.path.insert(0, str(HERE.parent / "benchmarks"))
    from bench_gpt_blocked import measure

    found: dict = {}
    figures = measure(check.sizes.gpt, check.sizes.gpt_bench_steps, check.work, seed=5, found=found)
    if check.sizes.gpt_bench_steps == check.sizes.gpt_steps:  # gpt_resume compares its final weights with these
        check.found["gpt_final_sha256"] = found["final_sha256"]
    check.summary["figures"]["gpt_benchmark"] = figures
    check.summary["figures"]["gpt_step_s"] = figures["bare loop (s)"] / check.sizes.gpt_bench_steps
    return {**figures, "commitment_device": found["device"]}


def gpt_resume(check: Check) -> dict:
    """SIGKILL after segment 2 is on disk, then resume: the final weights must be the uninterrupted run's."""
    code, out = gpt_code(check), check.work / "resume"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "TRAINMASTER_OUTPUT_DIR": str(out), "TRAINMASTER_SEED": "5",
           "TRAINMASTER_SEGMENT_STEPS": str(K), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "gpt.py", *gpt_options(check.sizes, check.sizes.gpt_steps)]
    log = open(check.work / "resume.log", "ab")
    first = subprocess.Popen(argv, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
    marker = out / "checkpoints" / "segments" / "00000002" / "manifest.json"
    deadline = time.monotonic() + max(30.0, check.left() - 60)
    while not marker.is_file() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if first.poll() is not None:
        raise RuntimeError(f"the run ended (exit {first.returncode}) before segment 2 was written")
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    began = time.monotonic()
    second = subprocess.run(argv, cwd=code, env={**env, "TRAINMASTER_RESUME_FROM": str(out / "checkpoints")},
                            stdout=log, stderr=subprocess.STDOUT, timeout=max(30.0, check.left() - 10))
    result = json.loads((out / "result.json").read_text()) if second.returncode == 0 else {}
    expected = check.found.get("gpt_final_sha256")
    found = {"killed_after_segment": 2, "resume_exit": second.returncode, "resume_s": round(time.monotonic() - began, 1),
             "final_sha256": result.get("final_sha256"), "uninterrupted_sha256": expected,
             "bit_exact": None if not expected else result.get("final_sha256") == expected,
             "self_checked": second.returncode == 0}
    check.summary["figures"]["gpt_resume_bit_exact"] = found["bit_exact"]
    if second.returncode:
        found["log_tail"] = (check.work / "resume.log").read_text(errors="replace")[-1500:]
    return found


def shipped_submits(check: Check) -> dict:
    found = {}
    for module, name in check.run_recipes.items():
        if check.left() < 60:
            found[name] = {"status": "skipped (time)"}
            continue
        folder = check.work / f"shipped-{module}"
        folder.mkdir(parents=True, exist_ok=True)
        job = job_yaml(folder / "job.yaml", name=name, entrypoint=f"python -m trainmaster.jobs.recipes.{module} --steps "
                       f"{check.sizes.shipped_steps[module]}", recipe=None, gpus=1 if check.sizes.device == "cuda" else 0,
                       seed=7)
        found[name] = check.submit(job, timeout=max(60.0, min(240.0, check.left() - 30)))
        check.found[f"run:{name}"] = (job, found[name])
    return found


def cpu_audits(check: Check) -> dict:
    """Every segment (up to the sizes' bound) of each shipped GPU run re-executed on the CPU, as a CPU broker
    audits a miner (:func:`audit_on_cpu`); a direct run of the runtime where the submit left none."""
    found = {}
    for module, name in check.run_recipes.items():
        ran, source = check.found.get(f"run:{name}"), "submit"
        if not ran or not ran[1].get("checkpoints") or not ran[1].get("commitment"):
            if check.left() < 80:
                found[name] = {"status": "no run to audit (and no time for a direct one)"}
                continue
            try:  # the submit failed or was not run: a direct run of the runtime, as an executor makes one
                ran, source = direct_job(check, module, name, check.sizes.shipped_steps[module], "shipped"), "direct run"
            except Exception as exc:  # noqa: BLE001 — the next recipe still runs
                found[name] = {"status": f"no run to audit: the direct run failed: {exc}"[:3000]}
                continue
        job, result = ran
        segments = list(range(min(result["commitment"]["n"], check.sizes.audit_segments)))
        found[name] = {"run": source, **audit_on_cpu(check, job, Path(result["checkpoints"]), result["commitment"], segments)}
    check.summary["figures"]["cpu_audits"] = {
        n: {k: v for k, v in f.items() if k in ("audited", "false_rejects", "max_r", "tau")} for n, f in found.items()}
    return found


def cross_device_audits(check: Check) -> dict:
    """Issue #30's false-reject count on the real pair: per shipped recipe, one direct run of ``cross_device_target``
    segments on this machine's device (as a miner's executor makes it), every segment re-executed on the CPU as a
    CPU broker audits it (:func:`audit_on_cpu`: the shipped cuda→cpu calibration)."""
    found = {}
    for module, name in check.run_recipes.items():
        if check.left() < 60:
            found[name] = {"status": "skipped (time)"}
            continue
        began = time.monotonic()
        try:
            job, result = direct_job(check, module, name, check.sizes.cross_device_target * K, "cross")
        except Exception as exc:  # noqa: BLE001 — the next recipe still runs
            found[name] = {"status": f"no run to audit: the direct run failed: {exc}"[:3000]}
            continue
        trained = round(time.monotonic() - began, 1)
        segments = list(range(result["commitment"]["n"]))
        found[name] = {"segments": len(segments), "train_s": trained,
                       **audit_on_cpu(check, job, Path(result["checkpoints"]), result["commitment"], segments)}
    check.summary["figures"]["cross_device_audits"] = {
        n: {k: f.get(k) for k in ("audited", "audited_with_an_update", "false_rejects", "max_r_over_tau", "pair")}
        for n, f in found.items()}
    return found


def direct_job(check: Check, module: str, name: str, steps: int, kind: str) -> tuple[Path, dict]:
    """:func:`direct_run` of a shipped recipe, with the job file that names its config and seed for the audit."""
    folder = check.work / f"{kind}-{module}"
    folder.mkdir(parents=True, exist_ok=True)
    job = job_yaml(folder / "job.yaml", name=name, entrypoint=f"python -m trainmaster.jobs.recipes.{module} --steps {steps}",
                   recipe=None, gpus=0, seed=7)
    checkpoints, commitment = direct_run(check, module, steps, out=folder / "run")
    return job, {"checkpoints": str(checkpoints), "commitment": commitment}


def audit_on_cpu(check: Check, job: Path, checkpoints: Path, commitment: dict, segments: list[int]) -> dict:
    """``segments`` of a committed run re-executed on the CPU as a CPU broker audits them (the shipped calibration of
    the (executor, cpu) pair), ten to a task in a pool of spawned processes over half the cores; tasks the budget
    leaves no time for are cancelled. False rejects are segments that failed (every run here is honest)."""
    from concurrent.futures import ProcessPoolExecutor, wait
    import multiprocessing

    workers = max(1, CORES // 2)
    chunks = [segments[i : i + 10] for i in range(0, len(segments), 10)]
    rows, reasons, raised, began = [], [], 0, time.monotonic()
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_audit_chunk, str(job), str(checkpoints), commitment, chunk): chunk for chunk in chunks}
        done, pending = wait(futures, timeout=max(10.0, check.left() - 30))
        for future in pending:
            future.cancel()
        for future in done:
            if future.exception() is None:
                rows += future.result()[0]
                reasons += future.result()[1]
            else:  # an honest run's segments that could not be audited count as rejected
                raised += len(futures[future])
                reasons.append(f"segments {futures[future]} could not be audited: {future.exception()}")
    updating = [r for r in rows if r["update_norm"]]
    rs = sorted(r["r"] for r in updating if r["r"] is not None)
    tau = rows[0]["tau"] if rows else None
    return {
        "executor": commitment.get("device") or "cpu", "pair": rows[0]["pair"] if rows else None, "tau": tau,
        "audited": len(rows), "audited_with_an_update": len(updating),
        "false_rejects": sum(not r["passed"] for r in rows) + raised, "reasons": reasons[:5],
        "median_r": rs[len(rs) // 2] if rs else None, "max_r": rs[-1] if rs else None,
        "max_r_over_tau": rs[-1] / tau if rs and tau else None,
        "max_field_r_over_tolerance": max((r["field"] for r in rows), default=None),
        "cpu_seconds": round(time.monotonic() - began, 1), "workers": workers,
    }


def _audit_chunk(job: str, checkpoints: str, commitment_json: dict, segments: list[int]) -> tuple[list[dict], list[str]]:
    """One task of :func:`audit_on_cpu`: ``segments`` audited on the CPU as a CPU broker audits them."""
    from trainmaster.jobs.commitment import Commitment
    from trainmaster.jobs.spec import load_spec
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.calibration import calibration_for_pair
    from trainmaster.verify.openings import LocalOpenings
    from trainmaster.verify.recipe_run import recipe_run

    commitment = Commitment.model_validate(commitment_json)
    run = recipe_run(load_spec(Path(job)))
    calibration = calibration_for_pair(None, run.job_class, commitment.device_kind, "cpu")
    report = run_audit(commitment=commitment, openings=LocalOpenings(Path(checkpoints)), segments=segments,
                       recipe=run.recipe, config=run.config, seed=run.seed, calibration=calibration, device="cpu")
    rows = [{"index": s.index, "passed": s.passed, "r": s.r, "update_norm": s.update_norm, "pair": calibration.pair,
             "tau": calibration.tau(run.k),
             "field": max((e.r / e.tolerance for e in s.fields.values() if e.tolerance), default=0.0)}
            for s in report.segments]
    return rows, report.reasons


def calibrations(check: Check) -> dict:
    """The real pairs measured: cuda→cpu and cuda→cuda (on a GPU; cpu→cpu in a rehearsal)."""
    from trainmaster.jobs.recipes import get_recipe
    from trainmaster.verify.calibrate import calibrate
    from trainmaster.verify.calibration import calibration_for_pair, store_calibration

    target = check.work / "calibrations"
    target.mkdir(parents=True, exist_ok=True)
    executor = check.sizes.device
    found = {}
    for module, name in check.recipes.items():
        recipe = get_recipe(name)
        config = recipe.config({"steps": check.sizes.calibration_steps[module]})
        for verifier in ("cpu", executor) if executor != "cpu" else ("cpu",):
            if check.left() < 45:
                found[f"{name} {executor}→{verifier}"] = {"status": "skipped (time)"}
                continue
            began = time.monotonic()
            try:
                measured = calibrate(recipe, config, ks=[K], seeds=[7], bases=check.sizes.calibration_bases,
                                     executor=executor, verifier=verifier)
            except Exception as exc:  # noqa: BLE001 — one recipe's failure keeps the others' measurements
                found[f"{name} {executor}→{verifier}"] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                                                          "traceback": traceback.format_exc()[-2500:]}
                continue
            path = store_calibration(measured, target)
            point = measured.point(K)
            shipped = calibration_for_pair(None, measured.job_class, "cpu", "cpu").point(K)
            found[f"{name} {executor}→{verifier}"] = {
                "file": path.name, "honest_r": point.honest_r, "honest_p99": point.honest_p99,
                "cheat_min": point.cheat_min, "separation": point.separation, "tau": point.tau,
                "shipped_cpu_tau": shipped.tau, "honest_p99_over_shipped_tau": point.honest_p99 / shipped.tau,
                "cheat_min_over_shipped_tau": point.cheat_min / shipped.tau, "seconds": round(time.monotonic() - began, 1),
            }
            with tarfile.open(check.out / "calibrations.tar", "w") as tar:  # after each: a later stop keeps these
                for kept in sorted(target.glob("*.json")):
                    tar.add(kept, arcname=kept.name)
            check.save()
    check.summary["figures"]["calibrations"] = {
        k: {key: v.get(key) for key in ("honest_p99", "cheat_min", "separation", "tau", "shipped_cpu_tau")}
        for k, v in found.items() if "file" in v}
    failed = [k for k, v in found.items() if v.get("status") == "failed"]
    if failed:
        raise RuntimeError(f"calibration failed for {', '.join(failed)}: {found[failed[0]]['error']}")
    return found


def gpt_cpu_audit(check: Check) -> dict:
    """One segment of the 86M GPU run re-executed on the CPU (cuda→cpu): its r, and what the audit costs."""
    from trainmaster.jobs.checkpoint import segment_dir
    from trainmaster.jobs.commitment import Commitment
    from trainmaster.jobs.devices import replaying_on
    from trainmaster.jobs.replay import load_state, replay_state
    from trainmaster.verify.audit import run_audit
    from trainmaster.verify.openings import LocalOpenings

    run = check.found.get("gpt_run") or {}
    if not run.get("checkpoints"):
        raise RuntimeError("stage gpt_submit left no checkpoints")
    sys.path.insert(0, str(gpt_code(check)))
    from gpt import RECIPE

    from trainmaster.jobs.recipes.options import parse_options

    checkpoints = Path(run["checkpoints"])
    commitment = Commitment.model_validate(run["commitment"])
    config = parse_options(RECIPE, gpt_options(check.sizes, check.sizes.gpt_steps)).model_dump(mode="json")
    state = load_state(segment_dir(checkpoints, 1))
    with replaying_on("cpu"):
        began = time.perf_counter()
        replay_state(RECIPE, state, 2, None, config)
        per_step = (time.perf_counter() - began) / 2  # (building the trainer included: an upper bound)
    gpu_step = check.summary["figures"].get("gpt_step_s")
    found = {"cpu_step_s": round(per_step, 3), "gpu_step_s": gpu_step,
             "cpu_over_gpu_step": round(per_step / gpu_step, 1) if gpu_step else None}
    if check.left() < K * per_step * 1.3 + 20:
        found["segment"] = f"not replayed: {check.left():.0f} s left, a segment needs ~{K * per_step:.0f} s"
    else:
        report = run_audit(commitment=commitment, openings=LocalOpenings(checkpoints), segments=[1], recipe=RECIPE,
                           config=config, seed=1, tau=4.7e-3, device="cpu")
        [segment] = report.segments
        found.update({"segment": 1, "r": segment.r, "passed": report.passed, "reasons": report.reasons[:3],
                      "fields": {k: v.r for k, v in segment.fields.items()}, "cpu_segment_s": round(report.replay_seconds, 1)})
    segment_gpu_s = (gpu_step or 0) * K
    cpu_segment = found.get("cpu_segment_s") or per_step * K
    # a production run: T = 10,000 steps (n = 400), q + 2 = 10 segments audited
    found["audit_fraction_T10000"] = round(10 * cpu_segment / (400 * segment_gpu_s), 4) if segment_gpu_s else None
    found["audit_fraction_this_run"] = round(commitment.n * cpu_segment / (commitment.n * segment_gpu_s), 2) if segment_gpu_s else None
    check.summary["figures"]["gpt_cpu_audit"] = {k: found.get(k) for k in ("r", "cpu_step_s", "cpu_over_gpu_step",
                                                                           "audit_fraction_T10000")}
    return found


def gpt_calibration(check: Check) -> dict:
    """The 86M model's own recipe calibrated on this device against itself (cuda→cuda; cpu→cpu in a rehearsal): one
    base state after its first segment, k = 25, the device's honest variants and the mildest cheat. No shipped
    calibration covers a job's own recipe; this says whether the tolerance separates the two at this size. The
    calibration itself goes into the summary (its JSON is small), so it needs no file of its own in ``OUT``."""
    from trainmaster.jobs.recipes.options import parse_options
    from trainmaster.verify.calibrate import calibrate
    from trainmaster.verify.calibration import store_calibration

    sys.path.insert(0, str(gpt_code(check)))
    from gpt import RECIPE

    device = check.sizes.device
    config = parse_options(RECIPE, gpt_options(check.sizes, 2 * K))
    began = time.monotonic()
    measured = calibrate(RECIPE, config, ks=[K], seeds=[7], bases=1, executor=device, verifier=device)
    path = store_calibration(measured, check.work / "gpt-calibration")
    point = measured.point(K)
    found = {"pair": f"{device}→{device}", "honest_r": point.honest_r, "honest_p99": point.honest_p99,
             "cheat_min": point.cheat_min, "separation": point.separation, "tau": point.tau,
             "seconds": round(time.monotonic() - began, 1), "calibration": json.loads(path.read_text())}
    check.summary["figures"]["gpt_calibration"] = {k: found[k] for k in ("pair", "honest_p99", "cheat_min",
                                                                          "separation", "tau", "seconds")}
    return found


LANE_B = ("shipped_submits", "cpu_audits", "cross_device_audits", "calibrations")
"""With ``--lanes 2`` these run in a second process beside the others (the small shipped recipes use the
CPU cores and little of the GPU, the 86M model the reverse), so both halves fit one device lease."""

STAGES = {  # in order; each with the seconds it needs at least
    "environment": (0, environment),
    "gpt_submit": (60, gpt_submit),
    "gpt_benchmark": (60, gpt_benchmark),
    "gpt_resume": (50, gpt_resume),
    "shipped_submits": (60, shipped_submits),
    "cpu_audits": (40, cpu_audits),
    "cross_device_audits": (60, cross_device_audits),
    "calibrations": (45, calibrations),
    "gpt_cpu_audit": (30, gpt_cpu_audit),
    "gpt_calibration": (90, gpt_calibration),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/trainmaster-gpu-check"))
    parser.add_argument("--budget", type=float, default=510.0, help="seconds for everything (stages skip past it)")
    parser.add_argument("--rehearse", action="store_true", help="the same stages on the CPU, small (no GPU needed)")
    parser.add_argument("--stages", nargs="*", choices=STAGES, help="run only these (default: all, in order)")
    parser.add_argument("--recipes", nargs="*", choices=sorted(RECIPES.values()), help="shipped recipes (default: all)")
    parser.add_argument("--run-recipes", nargs="*", choices=sorted(RECIPES.values()),
                        help="of those, the ones submitted and audited on the CPU (default: the same)")
    parser.add_argument("--lanes", type=int, choices=(1, 2), default=1,
                        help="2: the shipped recipes' stages in a second process at the same time (see LANE_B)")
    args = parser.parse_args(argv)
    import torch

    if not args.rehearse and not torch.cuda.is_available():
        print("gpu-check: this machine has no CUDA device torch can use; run it where there is one "
              "(docs/runtime.md, Devices), or --rehearse for the CPU rehearsal", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    check = Check(args.out, args.work, REHEARSAL if args.rehearse else GPU, args.budget)
    check.summary["mode"] = "rehearsal (cpu)" if args.rehearse else "gpu"
    if args.recipes:
        check.recipes = {module: name for module, name in RECIPES.items() if name in args.recipes}
    check.run_recipes = dict(check.recipes)
    if args.run_recipes:
        check.run_recipes = {module: name for module, name in RECIPES.items() if name in args.run_recipes}
    names = list(args.stages or STAGES)
    lane = start_lane_b(args, [n for n in names if n in LANE_B]) if args.lanes == 2 and set(LANE_B) & set(names) else None
    for name in names:
        if lane is not None and name in LANE_B:
            continue
        need, stage = STAGES[name]
        check.stage(name, need, lambda stage=stage: stage(check))
    if lane is not None:
        join_lane_b(check, lane, args)
    failed = [name for name, s in check.summary["stages"].items() if s["status"] == "failed"]
    check.summary["failed"] = failed
    check.save()
    check.say(f"done in {time.monotonic() - check.started:.0f} s; failed stages: {failed or 'none'}; summary "
              f"{args.out / 'gpu-check.json'}")
    print(json.dumps(check.summary["figures"], indent=2, default=str))
    return 1 if failed else 0


def start_lane_b(args: argparse.Namespace, stages: list[str]) -> subprocess.Popen:
    """``check.py`` again, for LANE_B's stages only, into ``OUT/lane-b`` and ``WORK/lane-b``, with a quarter of
    the CPU cores for torch's threads (the first lane's CPU audit of the 86M model wants the rest; one in a
    rehearsal, which shares a test runner's cores with other tests)."""
    out, work = args.out / "lane-b", args.work / "lane-b"
    out.mkdir(parents=True, exist_ok=True)
    words = ["--out", str(out), "--work", str(work), "--budget", str(args.budget - 5), "--stages", *stages]
    if args.rehearse:
        words.append("--rehearse")
    if args.recipes:
        words += ["--recipes", *args.recipes]
    if args.run_recipes:
        words += ["--run-recipes", *args.run_recipes]
    threads = "1" if args.rehearse else str(max(2, CORES // 4))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    log = open(out / "lane.log", "ab")
    print(f"[gpu-check] lane b: {', '.join(stages)} in a second process ({threads} threads; {out / 'lane.log'})",
          flush=True)
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *words], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def join_lane_b(check: Check, lane: subprocess.Popen, args: argparse.Namespace) -> None:
    """Wait for the second lane (past the budget it is stopped), then take its stages and figures into this
    check's summary and its ``calibrations.tar`` up into ``OUT``."""
    out = args.out / "lane-b"
    try:
        lane.wait(timeout=max(10.0, check.left() + 30))
    except subprocess.TimeoutExpired:
        lane.kill()
        lane.wait()
    try:
        found = json.loads((out / "gpu-check.json").read_text())
    except (OSError, ValueError) as exc:
        found = {"stages": {"lane b": {"status": "failed", "error": f"lane b left no summary: {exc}"}}}
    for name, result in found.get("stages", {}).items():
        check.summary["stages"][name] = {**result, "lane": "b"}
    check.summary["figures"].update(found.get("figures", {}))
    if (out / "calibrations.tar").is_file():
        os.replace(out / "calibrations.tar", args.out / "calibrations.tar")
    lines = (out / "lane.log").read_text(errors="replace").splitlines() if (out / "lane.log").is_file() else []
    for line in lines:
        if line.startswith("[gpu-check") and "] " in line:
            print(f"[lane b] {line}", flush=True)
    check.say(f"lane b ended (exit {lane.returncode})")
    check.save()


if __name__ == "__main__":
    sys.exit(main())

"""The whole GPU path on a real card, one command, one JSON (issues 30 and 40):

    python benchmarks/gpu_truth.py --out docs/gpu_truth/$(date +%F)-h100.json [--quick] [--images 8000]
        [--parts 4,6,8,1,2,3,7,5] [--timeout 3600] [--checks-timeout 180]

A card's run is saved under ``docs/gpu_truth/<date>-<card>.json`` (the JSON names the card, its driver, the date and
the command) and summarised in docs/gpu.md. The parts run in the order ``--parts`` gives; the default is the order a
15-minute lease allows (``DEFAULT_ORDER``): 4 (the 8,000 images, where training dominates), 6 (the small-share cap
fix), 8 (a minute: a network's first use), 1 (each command bounded by ``--checks-timeout``), 2 right before the 3
that compares with it, 7 (MPS), 5 last. Eight parts, each a function writing its section of the JSON:

1. ``pytest -m gpu`` (passed / failed / skipped, from its ``--junitxml``) and ``doctor --json`` (its verdict);
2. ``submit plans/option1.yaml --hardware A100-40GB`` on the built-in digits: wall time; every task's NVML peak (a
   sampler thread reads ``nvmlDeviceGetComputeRunningProcesses`` on every device each ``--every`` s and adds up each
   task's process tree; a task's pid is the ``process`` event the driver writes to ``events.jsonl``) against its
   share (its launch record, ``jobs/<job>[/<lane>]/launch.json``: ``gpu_memory_mib``) and against its share plus the
   CUDA context ``core.memcap`` names (``Cap.outside_mib``); every image task's busy share of its wall time; each
   job's CV; held-out;
3. the same plan with ``fold_parallel: false`` on every job, same sitting: wall time and CV, and the ratio of the two
   wall times = the side-by-side gain (goal >= 2x; the time model says 1.39x);
4. a competition of ``--images`` (8,000) images built here by ``benchmarks/competitions.py`` (derived from
   scikit-learn's digits: nothing downloaded), option1 on it: busy share per image task (goal >= 90 %), NVML peak <=
   share per task, held-out, and the dry run's predicted wall (``submit --dry-run --json``:
   ``timeline.predicted_wall_s``) against the run's actual one (its ``time_actual`` event with no job);
5. the slot service (``serve --no-ray``: jobs are processes of this machine): two slots, each running a timm spec job
   on digits, side by side; each job's NVML peak <= its slot's MiB;
6. a plan advised for an A10-24GB (``advise --hardware A10-24GB --budget 3m --out FILE``) run on this card with
   ``--hardware A10-24GB``: every task's NVML peak <= its record's share, which is of 24 GB, not of this card;
7. MPS, measured: where ``nvidia-cuda-mps-control`` and CUDA are, part 3's pair (side by side, one after another)
   again under an MPS daemon this part starts (``-d``, its own ``CUDA_MPS_PIPE_DIRECTORY`` and
   ``CUDA_MPS_LOG_DIRECTORY`` under the workdir) and stops (``echo quit |``, in a ``finally``): side-by-side gain,
   busy shares and NVML peaks with and without MPS. Each task's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (its
   ``core.memcap`` cap: allocator plus context) is recorded, not applied: gpupack gives no task its own environment
   (a timm job has no ``env`` in the plan schema) and builds nothing for MPS until it is measured to gain. Without the
   binary or without CUDA every figure is ``null`` beside its ``why``;
8. a network's first use: EfficientNet-B0 and ResNet-50, each's first training step (the job's ``Trainer``, bf16,
   channels last, batch 32) in a fresh process three times — a cold CUDA JIT cache of its own, the same cache warm,
   the cache disabled: whether the 12.8-19.9 s an EfficientNet's first step took on an H100 is paid once per machine
   (lanes started one after another would pay it once) or by every process.

Without CUDA (torch sees none, or NVML sees no device) every part runs as a CPU rehearsal (``--in-process`` where
Ray is not needed; ``--quick`` shrinks the plans: timm jobs at 1 epoch, 2 folds, resnet10t at 32 px, batch 64), and
every GPU figure is ``null`` beside a ``why``. The JSON's top names the card (NVML's name and MiB), the date, the
command and ``rehearsal``; ``card.driver`` is NVML's driver version (``null`` beside ``driver_why`` without NVML).
Everything is run as a user runs it (``python -m scheduler …`` in a subprocess) and read back from what the run
wrote, so the script measures the product, not a copy of its logic.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.budget import _last_json, read_events  # noqa: E402  (one reader of a run's events and answers)

PLAN = ROOT / "plans" / "option1.yaml"
HARDWARE = "A100-40GB"
SMALL_CARD = "A10-24GB"
# --quick's timm job: minutes on two busy cores (the batch kept, so the statistics rule does not quadruple the steps)
QUICK_TIMM = {"model": "resnet10t", "image_size": 32, "batch_size": 64, "fixed_batch": True, "epochs": 1, "folds": 2}
GOAL_GAIN = 2.0  # side by side vs one fold after another
MODEL_GAIN = 1.39  # what the time model says for option1 on digits
GOAL_BUSY = 0.90  # of an image task's wall time
MIB = 1024 * 1024
CHECKS_TIMEOUT_S = 180.0  # each of part 1's two commands, on a 15-minute lease
NO_CUDA = "no CUDA device: CPU rehearsal"
ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")  # a service job's end (core.states.JobState.terminal)


# --- the card -----------------------------------------------------------------------------------------------------


def card(nvml=None) -> dict:
    """NVML's devices (name, MiB) and whether torch sees CUDA; ``why`` says what is missing for a card run."""
    from scheduler.core.hardware import NoGpuFound, read_gpus

    try:
        gpus = [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib} for g in read_gpus(nvml)]
        nvml_why = None
    except NoGpuFound as e:
        gpus, nvml_why = [], str(e)
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    why = None if (gpus and cuda) else (f"{NO_CUDA} ({nvml_why or 'torch sees no CUDA'})")
    first = gpus[0] if gpus else {}
    return {"name": first.get("name"), "memory_mib": first.get("memory_mib"), "devices": gpus, "cuda": cuda,
            "why": why, **driver(nvml)}


def driver(nvml=None) -> dict:
    """NVML's driver version (``nvmlSystemGetDriverVersion``) as ``driver``, or ``None`` beside ``driver_why``."""
    from scheduler.core.hardware import NoGpuFound, Nvml

    try:
        nv = Nvml(nvml)
    except NoGpuFound as e:
        return {"driver": None, "driver_why": str(e)}
    try:
        version = nv.lib.nvmlSystemGetDriverVersion()
        return {"driver": version.decode() if isinstance(version, bytes) else str(version), "driver_why": None}
    except Exception as e:  # a driver (or a fake) that does not say
        return {"driver": None, "driver_why": f"NVML gave no driver version ({type(e).__name__}: {e})"}
    finally:
        nv.close()


# --- the NVML sampler ---------------------------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    from scheduler.core.proctree import ProcessTree  # the one sampler's: a pid and its descendants

    return ProcessTree.pids(pid)


class Sampler:
    """Each task's NVML peak, by process: every ``every_s`` it reads every device's compute processes (MiB by pid),
    asks ``pids_of()`` for the running tasks' pids (task → pid), and adds up each task's process tree (``tree``: a
    job's actor may start its script as a child). A task's peak is the largest such sum seen; ``samples`` counts the
    readings, so a run too short to be seen says so instead of reporting 0."""

    def __init__(self, nvml, pids_of: Callable[[], dict[str, int]], every_s: float = 0.5,
                 tree: Callable[[int], list[int]] = _tree):
        from scheduler.core.hardware import Nvml

        self.nv = Nvml(nvml)
        self.pids_of, self.every_s, self.tree = pids_of, every_s, tree
        self.peaks: dict[str, float] = {}
        self.pids: dict[str, set[int]] = {}
        self.samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self) -> None:
        used: dict[int, float] = {}
        for i in range(self.nv.count()):
            try:
                for pid, nbytes in self.nv.process_bytes(self.nv.handle(i)):
                    used[pid] = used.get(pid, 0.0) + nbytes / MIB
            except Exception as e:  # a device that went away: said once, the others still read
                if str(e) not in self.errors:
                    self.errors.append(str(e))
        for task, pid in self.pids_of().items():
            tree = self.tree(pid)
            self.pids.setdefault(task, set()).update(tree)
            mine = [used[p] for p in tree if p in used]
            if mine:
                self.peaks[task] = max(self.peaks.get(task, 0.0), sum(mine))
        self.samples += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as e:  # the sampler never takes the run down with it
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(self.every_s)

    def __enter__(self) -> "Sampler":
        self._thread = threading.Thread(target=self._loop, name="gpu-truth-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.sample_once()  # a last reading: a task that ended between two is simply not in it
        self.nv.close()


def pids_from_events(run_dir: Path) -> Callable[[], dict[str, int]]:
    """task → pid from the ``process`` events the Ray driver writes (``runtime.monitor``), read as the run goes."""
    def pids() -> dict[str, int]:
        return {e["job"]: int(e["pid"]) for e in read_events(run_dir)
                if e.get("event") == "process" and e.get("job") and e.get("pid")}
    return pids


# --- what a run folder says ---------------------------------------------------------------------------------------


def launch_records(run_dir: Path) -> dict[str, dict]:
    """Every task's saved launch record (``jobs/<job>/launch.json`` or ``jobs/<job>/<lane>/launch.json``) by task."""
    out = {}
    for path in sorted(Path(run_dir, "jobs").glob("**/launch.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        out[rec.get("task") or rec.get("job")] = rec
    return out


def outside_mib(share_mib: int, card_mib: int, card_name: str | None) -> int:
    """The CUDA context and libraries the cap leaves outside the allocator (``core.memcap``'s ``Cap.outside_mib``,
    for the card this process names)."""
    from scheduler.core.memcap import memory_cap
    from scheduler.policy.memory.overhead import outside_allocator_mib

    return memory_cap(share_mib, card_mib, outside_allocator_mib(card_name)).outside_mib


def peak_rows(records: dict[str, dict], peaks: dict[str, float] | None, why: str | None,
              card_name: str | None = None, card_mib: int | None = None) -> list[dict]:
    """One row per task with a GPU share: its share, the CUDA context, its NVML peak (None with ``why`` when there is
    no card or NVML never saw it) and whether the peak is within the share, and within share + context."""
    rows = []
    for task, rec in sorted(records.items()):
        share = rec.get("gpu_memory_mib")
        if not share:
            continue  # LightGBM and other CPU tasks: no share to hold
        outside = outside_mib(share, card_mib or rec.get("card_mib") or share, card_name)
        peak = None if peaks is None else peaks.get(task)
        row = {"task": task, "share_mib": share, "record_card_mib": rec.get("card_mib"), "outside_mib": outside,
               "nvml_peak_mib": None if peak is None else round(peak), "within_share": None,
               "within_share_plus_context": None}
        if peak is not None:
            row["within_share"] = peak <= share
            row["within_share_plus_context"] = peak <= share + outside
        else:
            row["why"] = why or "NVML never saw this task's processes (it ended between two readings?)"
        rows.append(row)
    return rows


def busy_shares(run_dir: Path, records: dict[str, dict]) -> dict[str, float | None]:
    """Each image task's busy share of its wall time (train, validation and prediction steps; ``core.walltime``),
    as the task last reported it in ``events.jsonl`` (its ``fold`` and ``telemetry`` events)."""
    image = {t for t, r in records.items() if r.get("gpu_memory_mib")}
    out: dict[str, float | None] = {t: None for t in image}
    for e in read_events(run_dir):
        if e.get("job") in image and e.get("busy_share") is not None:
            out[e["job"]] = e["busy_share"]
    return out


def startup_shares(run_dir: Path) -> dict[str, dict]:
    """Each task's start-up against its first fold's wall (start-up + one fold, ``time_actual``'s ``startup_s`` and
    ``fold_s``): the issue's "start-up < 10 % of a fold's wall"; ``share`` is ``None`` where a figure is missing."""
    from scheduler.policy.timing.timerecord import of_events

    out = {}
    for task, row in of_events(read_events(run_dir)).tasks.items():
        act = row.get("actual") or {}
        up, fold = act.get("startup_s"), act.get("fold_s")
        out[task] = {"startup_s": up, "fold_s": fold,
                     "share": round(up / (up + fold), 3) if up is not None and fold else None}
    return out


def cv_scores(summary: dict | None) -> dict[str, float | None]:
    return {j["name"]: j.get("cv_score") for j in (summary or {}).get("jobs", [])}


# --- running ------------------------------------------------------------------------------------------------------


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")}


def scheduler_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "scheduler", *map(str, args)]


def submit(plan: Path, run_dir: Path, hardware: str, ctx: "Sitting", data: Path | None = None, *,
           extra_env: dict | None = None) -> dict:
    """``submit PLAN --hardware H --json`` in a subprocess (``--in-process`` on a rehearsal: no Ray needed), NVML
    sampled while it runs on a card; the run's wall time, summary, records, peaks and busy shares. ``extra_env``
    is added to the run's environment (the MPS part's pipe and log folders)."""
    cmd = scheduler_cmd("submit", plan, "--hardware", hardware, "--json", "--run-dir", run_dir, "--no-dashboard")
    if data is not None:
        cmd += ["--data", str(data)]
    if ctx.rehearsal:
        cmd.append("--in-process")
    ctx.log(f"  $ {shlex.join(cmd[1:])}")
    t0 = time.time()
    sampler = None if ctx.rehearsal else Sampler(ctx.nvml, pids_from_events(run_dir), ctx.every_s)
    with sampler if sampler else _nothing():
        p = subprocess.run(cmd, cwd=ROOT, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
                           timeout=ctx.timeout_s)
    wall = round(time.time() - t0, 1)
    summary = _last_json(p.stdout)
    records = launch_records(run_dir)
    peaks = None if sampler is None else sampler.peaks
    out = {"command": shlex.join(cmd[1:]), "exit": p.returncode, "wall_s": wall, "run_dir": str(run_dir),
           "held_out": (summary or {}).get("held_out_score"), "cv": cv_scores(summary),
           "states": {j["name"]: j.get("state") for j in (summary or {}).get("jobs", [])},
           "tasks": peak_rows(records, peaks, ctx.why, ctx.card["name"]),
           "busy_share": busy_shares(run_dir, records), "startup_share": startup_shares(run_dir),
           "nvml_samples": None if sampler is None else sampler.samples}
    if sampler is not None and sampler.errors:
        out["nvml_errors"] = sampler.errors[:5]
    if p.returncode != 0:
        out["stderr_tail"] = p.stderr[-2000:]
    return out


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


def plan_copy(plan: Path, out: Path, quick: bool, **every_job) -> Path:
    """A copy of ``plan`` with ``every_job``'s keys set on each job whose kind has them (``fold_parallel`` is a timm
    job's: LightGBM's folds run in one process anyway); ``quick`` shrinks its timm jobs to ``QUICK_TIMM``
    (a rehearsal that runs in minutes on two cores; the packing is still the card's)."""
    import yaml

    from scheduler.core import kinds  # the plan's own schema: which keys each kind takes

    doc = yaml.safe_load(Path(plan).read_text())
    for job in doc.get("jobs", []):
        fields = kinds.get(job.get("kind", "timm")).spec.model_fields
        job.update({k: v for k, v in every_job.items() if k in fields})
        if quick and job.get("kind") == "timm":
            job.update(QUICK_TIMM)
            job.get("resources", {}).pop("gpu_memory", None)
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


class Sitting:
    """What every part shares: the card, the work folder, the flags, and the log."""

    def __init__(self, args: argparse.Namespace, card_info: dict, workdir: Path, nvml=None):
        self.card, self.workdir, self.args, self.nvml = card_info, workdir, args, nvml
        self.why = card_info["why"]
        self.rehearsal = self.why is not None
        self.quick = args.quick
        self.every_s = args.every
        self.timeout_s = args.timeout
        self.checks_timeout_s = getattr(args, "checks_timeout", None)  # part 1's own, per command

    def log(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def plan(self, name: str, **every_job) -> Path:
        return plan_copy(PLAN, self.workdir / f"{name}.yaml", self.quick, **every_job)


# --- the six parts ------------------------------------------------------------------------------------------------


def junit_counts(path: Path) -> dict:
    """passed / failed / skipped / errors from a pytest ``--junitxml`` file."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], "failed": n["failures"],
            "errors": n["errors"], "skipped": n["skipped"]}


def _bounded(cmd: list[str], ctx: Sitting, limit_s: float | None = None,
             extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """``cmd`` run to its end or to ``--timeout``; one that runs out is an answer (exit ``None``, what it printed so
    far and a line saying so), not an exception: part 1's second check still runs (on an H100, 2026-11-25,
    ``pytest -m gpu`` ran past a 200 s timeout and took doctor's verdict with it). ``limit_s`` (part 1's
    ``--checks-timeout``) shortens ``--timeout``, never lengthens it."""
    limit = min(ctx.timeout_s, limit_s or ctx.timeout_s)
    try:
        return subprocess.run(cmd, cwd=ROOT, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
                              timeout=limit)
    except subprocess.TimeoutExpired as e:
        text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        flag = ("--timeout" if limit == ctx.timeout_s else "--checks-timeout" if limit_s == ctx.checks_timeout_s
                else "the part's own limit")
        return subprocess.CompletedProcess(cmd, None, text(e.stdout),
                                           text(e.stderr) + f"\ntimed out after {limit:.0f} s ({flag})")


def part1_checks(ctx: Sitting) -> dict:
    """``pytest -m gpu`` and ``doctor --json``."""
    xml = ctx.workdir / "gpu_tests.xml"
    # tests/test_gpu_truth.py's gpu test is this script's part 2: it would run option1 on the card a second time
    where = ["tests/test_gpu_real.py"] if ctx.quick else ["tests", "--ignore=tests/test_gpu_truth.py"]
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *where]
    ctx.log(f"  $ {shlex.join(cmd[1:])}")
    p = _bounded(cmd, ctx, ctx.checks_timeout_s)
    tests = {"command": shlex.join(cmd[1:]), "exit": p.returncode,
             **(junit_counts(xml) if xml.is_file() else {"why": p.stdout[-1500:] + p.stderr[-1500:]})}
    if ctx.rehearsal:
        tests["note"] = "every gpu test skips without CUDA"
    dcmd = scheduler_cmd("doctor", "--json", *(["--no-gain"] if ctx.quick else []))
    ctx.log(f"  $ {shlex.join(dcmd[1:])}")
    d = _bounded(dcmd, ctx, ctx.checks_timeout_s)
    answer = _last_json(d.stdout) or {}
    checks = {c["name"]: c["status"] for c in answer.get("checks", [])}
    return {"pytest_gpu": tests,
            "doctor": {"command": shlex.join(dcmd[1:]), "exit": d.returncode, "ok": answer.get("ok"),
                       "checks": checks,
                       "failed": {c["name"]: c.get("detail") for c in answer.get("checks", [])
                                  if c["status"] == "failed"}}}


def part2_option1(ctx: Sitting) -> dict:
    """option1 on digits with folds side by side: the run everything else is compared with."""
    out = submit(ctx.plan("option1"), ctx.workdir / "option1", HARDWARE, ctx)
    return _judged(out, ctx)


def part3_sequential(ctx: Sitting, side_by_side: dict | None) -> dict:
    """The same plan with ``fold_parallel: false`` on every job: the side-by-side gain."""
    out = submit(ctx.plan("option1_sequential", fold_parallel=False), ctx.workdir / "option1_sequential", HARDWARE, ctx)
    seq, par = out["wall_s"], (side_by_side or {}).get("wall_s")
    measured = round(seq / par, 3) if (seq and par and out["exit"] == 0 and side_by_side.get("exit") == 0) else None
    out["gain"] = {"goal": GOAL_GAIN, "time_model": MODEL_GAIN, "ratio": None if ctx.rehearsal else measured,
                   "cpu_ratio": measured if ctx.rehearsal else None}
    if ctx.rehearsal:
        out["gain"]["why"] = (f"{ctx.why}: --in-process runs every task one after another, so the CPU ratio says "
                              "nothing of folds side by side on a card")
    elif measured is None:
        out["gain"]["why"] = "a run failed, or part 2 did not run"
    else:
        out["gain"]["meets_goal"] = measured >= GOAL_GAIN
    return out


def part4_competition(ctx: Sitting) -> dict:
    """option1 on a competition of ``--images`` images built here (derived from scikit-learn's digits)."""
    from benchmarks.competitions import build

    n = ctx.args.images or (300 if ctx.quick else 8000)
    data = ctx.workdir / f"competition-{n}"
    t0 = time.time()
    build(data, n)
    made = round(time.time() - t0, 1)
    plan = ctx.plan("option1_competition")
    dry = dry_run(plan, data, ctx)  # before the run: after it, the prediction would have learned from the run itself
    out = submit(plan, ctx.workdir / "option1_competition", HARDWARE, ctx, data=data)
    out["data"] = {"images": n, "dir": str(data), "built_s": made,
                   "how": "benchmarks/competitions.py build(root, n): derived from scikit-learn's 8x8 digits "
                          "(enlarged, moved, stroke and contrast varied, noise), split by source digit"}
    out["wall_predicted_vs_actual"] = predicted_vs_actual(dry, ctx, Path(out["run_dir"]))
    return _judged(out, ctx, busy_goal=GOAL_BUSY)


def dry_run(plan: Path, data: Path | None, ctx: Sitting) -> subprocess.CompletedProcess:
    """``submit PLAN --hardware H --dry-run --json``: the prediction a user sees before spending the card."""
    cmd = scheduler_cmd("submit", plan, "--hardware", HARDWARE, "--dry-run", "--json",
                        *(["--data", str(data)] if data is not None else []))
    ctx.log(f"  $ {shlex.join(cmd[1:])}")
    return _bounded(cmd, ctx)


def predicted_vs_actual(p: subprocess.CompletedProcess, ctx: Sitting, run_dir: Path) -> dict:
    """The dry run's predicted wall (``p``, from :func:`dry_run`: ``timeline.predicted_wall_s``) against the run's
    actual one (its ``time_actual`` event with no job: ``actual.wall_s``), and their ratio; a figure that is missing
    is ``None`` beside a ``why``. On a rehearsal both are the CPU's, not the card's."""
    from scheduler.policy.timing.timerecord import of_events

    cmd = p.args
    predicted = ((_last_json(p.stdout) or {}).get("timeline") or {}).get("predicted_wall_s")
    actual = of_events(read_events(run_dir)).actual_wall_s
    out = {"command": shlex.join(cmd[1:]), "exit": p.returncode, "predicted_wall_s": predicted,
           "actual_wall_s": actual, "actual_over_predicted": round(actual / predicted, 3) if predicted and actual
           else None}
    whys = [w for w, missing in ((f"the dry run gave no timeline.predicted_wall_s (exit {p.returncode})",
                                  predicted is None), ("the run wrote no time_actual event for the run",
                                                       actual is None)) if missing]
    if whys:
        out["why"] = "; ".join(whys)
    if ctx.rehearsal:
        out["note"] = f"{ctx.why}: a CPU run's wall, not the card's"
    return out


def _judged(out: dict, ctx: Sitting, busy_goal: float | None = None) -> dict:
    """The run's figures with the verdicts: every peak within its share, and the busy goal where there is one."""
    peaks = [r["within_share"] for r in out["tasks"]]
    out["all_within_share"] = None if (ctx.rehearsal or None in peaks or not peaks) else all(peaks)
    if out["all_within_share"] is None:
        out["all_within_share_why"] = ctx.why or "a task's peak was not seen"
    if busy_goal is not None:
        busy = out["busy_share"]
        out["busy_goal"] = busy_goal
        out["busy_meets_goal"] = None if ctx.rehearsal else {t: (b is not None and b >= busy_goal)
                                                            for t, b in busy.items()}
        if ctx.rehearsal:
            out["busy_why"] = f"{ctx.why}: busy shares are of CPU steps, not of the card"
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def part5_service(ctx: Sitting) -> dict:
    """Two slots of the slot service, a timm spec job in each, side by side; each job's NVML peak vs its slot."""
    state, port = ctx.workdir / "service", _free_port()
    hw = "auto" if not ctx.rehearsal else HARDWARE
    cmd = scheduler_cmd("serve", "--state", state, "--port", port, "--hardware", hw, "--no-ray", "--json")
    ctx.log(f"  $ {shlex.join(cmd[1:])}")
    log = (ctx.workdir / "service.out").open("w")
    server = subprocess.Popen(cmd, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
    spec = {"kind": "timm", "model": "resnet18", "image_size": 64, "batch_size": 32, "epochs": 3, "folds": 2}
    if ctx.quick:
        spec.update(QUICK_TIMM)
    jobs: dict[str, dict] = {}
    out: dict = {"command": shlex.join(cmd[1:]), "spec": spec}
    try:
        client = _wait_for_service(f"http://127.0.0.1:{port}", state, server, ctx)
        slots = [client.request_slot(gpu_memory="4GB", cpus=1, minutes=20, label=f"truth{i}") for i in (1, 2)]
        for s in slots:
            j = client.submit_job(s["slot_id"], job=spec, data="digits")
            jobs[j["job_id"]] = {"slot": s["slot_id"], "slot_mib": s.get("gpu_memory_mib"),
                                 "device": s.get("device")}

        def pids() -> dict[str, int]:
            got = {}
            for jid in jobs:
                st = client.job_status(jid)
                if st.get("pid") and st.get("state") == "RUNNING":
                    got[jid] = int(st["pid"])
            return got

        sampler = None if ctx.rehearsal else Sampler(ctx.nvml, pids, ctx.every_s)
        deadline = time.time() + ctx.timeout_s
        with sampler if sampler else _nothing():
            while time.time() < deadline:
                states = {jid: client.job_status(jid) for jid in jobs}
                if all(s["state"] in ENDED for s in states.values()):
                    break
                time.sleep(1)
        rows = []
        for jid, info in jobs.items():
            st = client.job_status(jid)
            peak = None if sampler is None else sampler.peaks.get(jid)
            share = info["slot_mib"]
            row = {"job": jid, "slot": info["slot"], "state": st["state"], "slot_mib": share,
                   "started": st.get("started"), "ended": st.get("ended"),
                   "cv": ((st.get("outputs") or {}).get("cv_score")),
                   "nvml_peak_mib": None if peak is None else round(peak),
                   "within_slot": None if peak is None else peak <= share}
            if peak is None:
                row["why"] = ctx.why or "NVML never saw this job's processes"
            rows.append(row)
        out["jobs"] = rows
        starts = [r["started"] for r in rows if r["started"]]
        ends = [r["ended"] for r in rows if r["ended"]]
        out["overlap_s"] = (round(min(ends) - max(starts), 1) if len(starts) == 2 and len(ends) == 2 else None)
        out["all_within_slot"] = (None if ctx.rehearsal or any(r["within_slot"] is None for r in rows)
                                  else all(r["within_slot"] for r in rows))
        if out["all_within_slot"] is None:
            out["why"] = ctx.why or "a job's peak was not seen"
        for s in slots:
            client.release(s["slot_id"])
        client.close()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    return out


def _wait_for_service(url: str, state: Path, server: subprocess.Popen, ctx: Sitting, wait_s: float = 120):
    from scheduler.service.client import Client

    t0 = time.time()
    while time.time() - t0 < wait_s:
        if server.poll() is not None:
            raise RuntimeError(f"serve exited {server.returncode}: "
                               f"{(ctx.workdir / 'service.out').read_text()[-1500:]}")
        if (state / "token").is_file():
            client = Client(url, state_dir=state)
            try:
                client.health()
                return client
            except Exception:
                client.close()
        time.sleep(0.5)
    raise RuntimeError(f"serve did not answer within {wait_s:.0f} s")


def part6_small_card(ctx: Sitting) -> dict:
    """A plan advised for an A10-24GB, run on this card as an A10-24GB: each task within its share of 24 GB."""
    from scheduler.core.hardware import profile

    plan = ctx.workdir / "advised_a10.yaml"
    cmd = scheduler_cmd("advise", "--hardware", SMALL_CARD, "--budget", ctx.args.advise_budget, "--json",
                        "--out", plan, *(["--models", "resnet18,lightgbm"] if ctx.quick else []))
    ctx.log(f"  $ {shlex.join(cmd[1:])}")
    a = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=ctx.timeout_s)
    if a.returncode != 0 or not plan.is_file():
        return {"advise": {"command": shlex.join(cmd[1:]), "exit": a.returncode, "stderr_tail": a.stderr[-1500:]}}
    if ctx.quick:
        plan_copy(plan, plan, quick=True)
    out = submit(plan, ctx.workdir / "advised_a10", SMALL_CARD, ctx)
    small = profile(SMALL_CARD).memory_mib
    out["advise"] = {"command": shlex.join(cmd[1:]), "exit": a.returncode, "plan": str(plan)}
    out["card_mib_planned"] = small
    out["records_of_small_card"] = all(r["record_card_mib"] == small for r in out["tasks"]) if out["tasks"] else None
    return _judged(out, ctx)


# --- part 7: MPS, measured -----------------------------------------------------------------------------------------

MPS_CONTROL = "nvidia-cuda-mps-control"
NO_MPS = f"no {MPS_CONTROL} on this machine"
MPS_NO_CUDA = "no CUDA: a CPU rehearsal"
MPS_LIMIT_WHY = ("gpupack sets no per-task environment ({which}), and MPS is built into nothing until it is "
                 "measured to gain (issue 40)")


def mps_why(ctx: Sitting) -> str | None:
    """Why the MPS part cannot measure here (no daemon binary, or no CUDA), or None."""
    if not shutil.which(MPS_CONTROL):
        return NO_MPS
    return MPS_NO_CUDA if ctx.rehearsal else None


def mps_limits(plan: Path, records: dict[str, dict], card_name: str | None) -> list[dict]:
    """Per task, the ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` its client would get: the same cap as its allocator
    (``core.memcap``: the allocator's MiB plus the context outside it, i.e. what NVML counts), on its one visible
    device (ordinal 0); whether it was applied, and why not."""
    import yaml

    from scheduler.core import kinds
    from scheduler.core.memcap import memory_cap
    from scheduler.policy.memory.overhead import outside_allocator_mib

    job_kind = {j["name"]: j.get("kind", "timm") for j in yaml.safe_load(plan.read_text()).get("jobs", [])}
    rows = []
    for task, rec in sorted(records.items()):
        share = rec.get("gpu_memory_mib")
        if not share:
            continue
        cap = memory_cap(share, rec.get("card_mib") or share, outside_allocator_mib(card_name))
        kind = job_kind.get(rec.get("job") or task.split("/")[0], "timm")
        has_env = "env" in kinds.get(kind).spec.model_fields
        which = (f"a {kind} job's env is one per job, not per task" if has_env
                 else f"a {kind} job has no env in the plan schema")
        rows.append({"task": task, "allocator_mib": cap.allocator_mib, "outside_mib": cap.outside_mib,
                     "limit": f"0={cap.allocator_mib + cap.outside_mib}M", "applied": False,
                     "why": MPS_LIMIT_WHY.format(which=which)})
    return rows


class MpsDaemon:
    """An MPS control daemon of this sitting's own (``nvidia-cuda-mps-control -d``), its pipe and log folders under
    ``root``; ``env`` is what a client needs to find it. Stopped with ``echo quit | nvidia-cuda-mps-control``."""

    def __init__(self, root: Path, ctx: Sitting):
        pipe, logs = root / "pipe", root / "log"
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(logs)}
        self.ctx, self.started = ctx, None

    def __enter__(self) -> "MpsDaemon":
        self.ctx.log(f"  $ {MPS_CONTROL} -d  ({self.env})")
        p = subprocess.run([MPS_CONTROL, "-d"], env={**env(), **self.env}, capture_output=True, text=True, timeout=60)
        self.started = p.returncode == 0
        if not self.started:
            raise RuntimeError(f"{MPS_CONTROL} -d exited {p.returncode}: {p.stderr[-500:]}")
        return self

    def __exit__(self, *exc) -> None:
        self.ctx.log(f"  $ echo quit | {MPS_CONTROL}")
        subprocess.run([MPS_CONTROL], input="quit\n", env={**env(), **self.env}, capture_output=True, text=True,
                       timeout=60)


PAIRED = ("side_by_side_gain", "busy_share", "nvml_peak_mib", "wall_s")  # each with and without MPS


def _pair_figures(par: dict | None, seq: dict | None) -> dict:
    """One pair's side-by-side gain (one after another over side by side), busy shares and NVML peaks."""
    ok = bool(par and seq and par.get("exit") == 0 and seq.get("exit") == 0 and par.get("wall_s"))
    return {"side_by_side_gain": round(seq["wall_s"] / par["wall_s"], 3) if ok else None,
            "busy_share": (par or {}).get("busy_share"),
            "nvml_peak_mib": {t["task"]: t["nvml_peak_mib"] for t in (par or {}).get("tasks", [])},
            "wall_s": {"side_by_side": (par or {}).get("wall_s"), "one_after_another": (seq or {}).get("wall_s")}}


# the job's own first step (jobs.trainer: bf16 autocast, channels last, AdamW) in a fresh process, timed; JSON out
_FIRST_USE = r"""
import json, sys, time
t0 = time.perf_counter()
import timm, torch
from jobs.trainer import StepSettings, Trainer
model_name, batch, dev = sys.argv[1], int(sys.argv[2]), torch.device(sys.argv[3] if len(sys.argv) > 3 else "cuda")
torch.zeros(1, device=dev)
context_s = time.perf_counter() - t0
model = timm.create_model(model_name, num_classes=10).to(dev).to(memory_format=torch.channels_last)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
trainer = Trainer(model, opt, StepSettings(dev, torch.bfloat16, 1, True), total_samples=100 * batch,
                  batch_size=batch)
x = torch.randint(0, 255, (batch, 3, 224, 224), dtype=torch.uint8)
y = torch.randint(0, 10, (batch,))
steps = [trainer.step((x, y)).seconds for _ in range(4)]
print(json.dumps({"imports_and_context_s": round(context_s, 3), "first_step_s": round(steps[0], 3),
                  "steady_step_s": round(sum(steps[1:]) / 3, 4)}))
"""
FIRST_USE_MODELS = (("efficientnet_b0", 32), ("resnet50", 32))


def part8_first_use(ctx: Sitting) -> dict:
    """What a network's first step pays on the card, and whether a second process pays it again: each model's first
    step in a fresh process, three times in a row — ``cold`` (an empty CUDA JIT cache of its own, ``CUDA_CACHE_PATH``
    under the workdir), ``warm`` (the same cache again: what a lane started after another would find), ``no_cache``
    (``CUDA_CACHE_DISABLE=1``). On an H100 EfficientNets' first steps took 12.8-19.9 s, a ResNet's about 1 s
    (2026-11-28): if ``warm`` is short, the cost is the driver's JIT, cached per machine, and lanes started one after
    another pay it once; if not, every process pays it (``tasktime.FIRST_USE_S``)."""
    if ctx.rehearsal:
        return {"why": ctx.why, "runs": None}
    cache = ctx.workdir / "cuda-jit-cache"
    runs = []
    for model, batch in FIRST_USE_MODELS:
        for name, extra in (("cold", {"CUDA_CACHE_PATH": str(cache / model)}),
                            ("warm", {"CUDA_CACHE_PATH": str(cache / model)}), ("no_cache", {"CUDA_CACHE_DISABLE": "1"})):
            cmd = [sys.executable, "-c", _FIRST_USE, model, str(batch)]
            t0 = time.time()
            p = _bounded(cmd, ctx, 300, extra_env=extra)  # one that runs out: exit None, "timed out" in its stderr
            row = {"model": model, "batch": batch, "run": name, "exit": p.returncode,
                   **(_last_json(p.stdout) or {"stderr_tail": p.stderr[-1500:]}), "process_s": round(time.time() - t0, 1)}
            ctx.log(f"  {model} b{batch} {name}: first step {row.get('first_step_s')} s")
            runs.append(row)
    return {"runs": runs, "cache": str(cache)}


def part7_mps(ctx: Sitting, sections: dict) -> dict:
    """Part 3's pair (side by side, then one after another) again under an MPS daemon this part starts and stops;
    the gain, busy shares and NVML peaks with and without MPS (without: parts 2 and 3 of this sitting, run here if
    they did not run). Without the binary or without CUDA every figure is None beside the reason."""
    why = mps_why(ctx)
    out: dict = {"mps_control": shutil.which(MPS_CONTROL), "why": why}
    if why is not None:
        for key in PAIRED:
            out[key] = {"without_mps": None, "with_mps": None, "why": why}
        for key in ("mps_gain_over_plain", "gains", "client_limits"):
            out[key], out[f"{key}_why"] = None, why
        return out
    plain_par = sections.get(PARTS[2]) or part2_option1(ctx)
    plain_seq = sections.get(PARTS[3]) or part3_sequential(ctx, plain_par)
    daemon = MpsDaemon(ctx.workdir / "mps", ctx)
    with daemon:
        par_plan = ctx.plan("option1_mps")
        par = submit(par_plan, ctx.workdir / "option1_mps", HARDWARE, ctx, extra_env=daemon.env)
        seq = submit(ctx.plan("option1_mps_sequential", fold_parallel=False), ctx.workdir / "option1_mps_sequential",
                     HARDWARE, ctx, extra_env=daemon.env)
    without, with_ = _pair_figures(plain_par, plain_seq), _pair_figures(par, seq)
    for key in without:
        out[key] = {"without_mps": without[key], "with_mps": with_[key]}
    g0, g1 = without["side_by_side_gain"], with_["side_by_side_gain"]
    w0, w1 = without["wall_s"]["side_by_side"], with_["wall_s"]["side_by_side"]
    out["mps_gain_over_plain"] = round(w0 / w1, 3) if (w0 and w1 and par["exit"] == 0) else None
    out["gains"] = None if g0 is None or g1 is None else g1 > g0
    out["client_limits"] = mps_limits(par_plan, launch_records(ctx.workdir / "option1_mps"), ctx.card["name"])
    out["runs"] = {"with_mps": {"side_by_side": _judged(par, ctx), "one_after_another": seq}}
    return out


PARTS = {1: "checks", 2: "option1", 3: "sequential", 4: "competition", 5: "service", 6: "small_card", 7: "mps",
         8: "first_use"}
# A 15-minute lease: part 4 first (8,000 images: the only part where training dominates, never run on a card), then
# part 6 (the small-share cap fix), part 1 (pytest -m gpu and doctor, each bounded by --checks-timeout), part 2 right
# before the part 3 that compares with it (the side-by-side gain), the MPS part after them (it reuses both), part 5
# last (its figures are in from 2026-11-25). Part 8 (a minute: whether a network's first-use cost is paid once per
# machine or once per process) right after part 6: it decides what start-up work is worth doing.
DEFAULT_ORDER = (4, 6, 8, 1, 2, 3, 7, 5)


def _run_part(n: int, ctx: Sitting, sections: dict) -> dict:
    """Part ``n``, given what the parts before it brought back (part 3 runs part 2 first if it did not run: its
    gain is of two runs of the same sitting, never of a missing one)."""
    if n == 3:
        side = sections.get(PARTS[2])
        if side is None:
            side = sections[PARTS[2]] = part2_option1(ctx)
            side["run_by"] = "part 3: part 2 did not run before it"
        return part3_sequential(ctx, side)
    if n == 7:
        return part7_mps(ctx, sections)
    return {1: part1_checks, 2: part2_option1, 4: part4_competition, 5: part5_service, 6: part6_small_card,
            8: part8_first_use}[n](ctx)


def run_parts(ctx: Sitting, parts: list[int], done: Callable[[dict], None] = lambda sections: None) -> dict:
    """Each asked-for part in the order asked, its section of the JSON; a part that raises is a section with its
    error, the others still run (a card run is rare: one fault must not cost the rest of the figures). ``done`` is
    called with the sections so far after every part: the JSON is on disk before the next part starts, so a sitting
    cut short (a device call's time limit) still hands back every part it finished."""
    sections: dict = {}
    for n in parts:
        name = PARTS[n]
        ctx.log(f"part {n}: {name}")
        t0 = time.time()
        try:
            sec = _run_part(n, ctx, sections)
        except Exception as e:
            import traceback

            sec = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
        sec["part_s"] = round(time.time() - t0, 1)
        sections[name] = sec
        done(sections)
    return sections


# --- the document and its table -----------------------------------------------------------------------------------


def document(ctx: Sitting, argv: list[str], sections: dict) -> dict:
    return {"card": {k: ctx.card.get(k) for k in ("name", "memory_mib", "devices", "cuda", "driver", "driver_why")},
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": shlex.join(["python", "benchmarks/gpu_truth.py", *argv]),
            "rehearsal": ctx.rehearsal, "why": ctx.why, "quick": ctx.quick, "host": socket.gethostname(),
            "parts": sections}


def _f(v, spec: str = "") -> str:
    return "—" if v is None else format(v, spec)


def table(doc: dict) -> str:
    """The short table printed after the JSON is written: one line per run and per task."""
    card_ = doc["card"]
    lines = [f"card: {card_['name'] or 'none'} ({_f(card_['memory_mib'], ',')} MiB, driver "
             f"{card_.get('driver') or '—'}), {doc['date']}, "
             f"{'CPU REHEARSAL: ' + doc['why'] if doc['rehearsal'] else 'on the card'}"]
    parts = doc["parts"]
    c = parts.get("checks")
    if c and "error" not in c:
        t = c["pytest_gpu"]
        lines.append(f"1 pytest -m gpu: {t.get('passed')} passed, {t.get('failed')} failed, {t.get('skipped')} "
                     f"skipped; doctor ok={c['doctor']['ok']} {c['doctor']['checks']}")
    for n, key in ((2, "option1"), (3, "sequential"), (4, "competition"), (6, "small_card")):
        r = parts.get(key)
        if not r:
            continue
        if "error" in r or "wall_s" not in r:
            lines.append(f"{n} {key}: {r.get('error') or r.get('advise')}")
            continue
        cv = ", ".join(f"{j} {_f(s, '.3f')}" for j, s in r["cv"].items())
        lines.append(f"{n} {key}: exit {r['exit']}, wall {r['wall_s']:.0f} s, held-out {_f(r['held_out'], '.4f')}, "
                     f"CV {cv}")
        pva = r.get("wall_predicted_vs_actual")
        if pva:
            lines.append(f"  wall predicted {_f(pva['predicted_wall_s'], '.0f')} s, actual "
                         f"{_f(pva['actual_wall_s'], '.0f')} s (x{_f(pva['actual_over_predicted'], '.2f')})")
        if key == "sequential":
            g = r["gain"]
            lines.append(f"  side-by-side gain {_f(g['ratio'], '.2f')}x (goal {g['goal']}x, time model "
                         f"{g['time_model']}x){'; ' + g['why'] if g.get('why') else ''}")
        for t in r["tasks"]:
            lines.append(f"  {t['task']:<18} share {t['share_mib']:>6,} MiB (+{t['outside_mib']} context)  NVML peak "
                         f"{_f(t['nvml_peak_mib'], ','):>6}  busy {_f(r['busy_share'].get(t['task']), '.0%')}  start-up "
                         f"{_f((r.get('startup_share', {}).get(t['task']) or {}).get('share'), '.0%')} of a fold")
    m = parts.get("mps")
    if m:
        gain = m.get("side_by_side_gain") or {}
        lines.append(f"7 mps: {m.get('error') or m.get('why') or 'measured'}; side-by-side gain without "
                     f"{_f(gain.get('without_mps'), '.2f')}x, with {_f(gain.get('with_mps'), '.2f')}x")
    s = parts.get("service")
    if s:
        if "error" in s:
            lines.append(f"5 service: {s['error']}")
        else:
            for j in s.get("jobs", []):
                lines.append(f"5 service {j['job']}: {j['state']}, slot {j['slot_mib']} MiB, NVML peak "
                             f"{_f(j['nvml_peak_mib'])}, CV {_f(j['cv'], '.3f')}")
            lines.append(f"  side by side for {_f(s.get('overlap_s'))} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_truth.json", help="the JSON's path (default gpu_truth.json)")
    ap.add_argument("--quick", action="store_true", help="small plans and sizes (the CPU rehearsal of the tests)")
    ap.add_argument("--images", type=int, help="part 4's competition size (default 8000; --quick 300)")
    ap.add_argument("--parts", default=",".join(map(str, DEFAULT_ORDER)),
                    help="which parts, run in the order given, e.g. 2 or 4,6,1 (default all, in the order a "
                         f"15-minute lease allows: {','.join(map(str, DEFAULT_ORDER))})")
    ap.add_argument("--advise-budget", default="3m",
                    help="part 6's `advise --budget` (default 3m: the H100's 87 s run, within a 15-minute lease)")
    ap.add_argument("--every", type=float, default=0.5, help="seconds between NVML readings (default 0.5)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds any one command may take (default 3600)")
    ap.add_argument("--checks-timeout", type=float, default=CHECKS_TIMEOUT_S,
                    help=f"seconds each of part 1's commands (pytest -m gpu, doctor) may take, within --timeout "
                         f"(default {CHECKS_TIMEOUT_S:.0f}: part 1 must leave a 15-minute lease time for part 3)")
    ap.add_argument("--workdir", help="where runs and the competition go (default a new temp folder)")
    args = ap.parse_args(argv)
    try:
        parts = list(dict.fromkeys(int(p) for p in args.parts.split(",") if p.strip()))
    except ValueError:
        parts = [0]
    if not parts or not set(parts) <= set(PARTS):
        ap.error(f"--parts: a comma-separated list of {sorted(PARTS)}, got {args.parts!r}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_truth-"))
    workdir.mkdir(parents=True, exist_ok=True)
    ctx = Sitting(args, card(), workdir)
    ctx.log(f"gpu_truth: {ctx.why if ctx.rehearsal else ctx.card['name']}; work in "
            f"{workdir}")
    out = Path(args.out)

    def write(sections: dict) -> None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(document(ctx, argv, sections), indent=1))
        tmp.replace(out)

    sections = run_parts(ctx, parts, done=write)
    write(sections)
    doc = json.loads(out.read_text())
    print(table(doc))
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What gpupack adds to starting jobs on Ray, measured in one run against bare Ray actors.

- per job launch: gpupack's actor (its resources, its device, its job) until its first poll answers (RUNNING),
  against a bare actor (``num_cpus=1``, one method call answered), each created and answered one at a time;
- submit to running: from ``submit()`` (Ray already up, as when joining a cluster) until every first-wave job is
  RUNNING, against the same number of bare actors created at once that run the same job themselves (answer, read
  the competition, run the same script: ``BareJob``) until all answered — what the jobs would cost without gpupack.
  On a machine with fewer cores than first-wave jobs, a job that is up takes cores from its siblings still starting,
  with or without gpupack; idle bare actors (``Bare``: they answer and do nothing) are measured too and printed
  beside it, as the floor no job that does work reaches.

Both figures are measured in one sitting, bare and gpupack alternating run by run (so a change in the machine's load
falls on both alike), ``--repeats`` times each (at least 5): the medians, their ratios against the issue's goals
(per launch ≤ 1.05×, submit to running ≤ 1.1×) and the load average before and after (``os.getloadavg``: a busy
machine stretches both sides, but not always alike) are printed, or written as one JSON object with ``--json``.

    python benchmarks/overhead.py [--jobs 4] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from scheduler.core import hardware  # noqa: E402
from scheduler.core import plan as planmod  # noqa: E402
from scheduler.policy.planning import dryrun  # noqa: E402
from scheduler.runtime import cluster as runtime  # noqa: E402 -- the cluster's resources
from scheduler.runtime.driver import RunOptions  # noqa: E402
from scheduler.runtime.submit import submit  # noqa: E402
from scheduler.store import datasource  # noqa: E402
from scheduler.store.record import events_from  # noqa: E402


@ray.remote(num_cpus=1)
class Bare:
    def ping(self):
        return os.getpid()


@ray.remote(num_cpus=1)
class BareJob:
    """Bare Ray doing the job a gpupack task does: answer, then read the competition (pandas) and run the same
    script with the same data, folds and sleep, as a user's own actor would. Its siblings start while it works, as a
    gpupack task's do: the like-for-like baseline of a first wave."""

    def ping(self, argv: list[str], env: dict[str, str]):
        def work():
            import subprocess

            import pandas as pd

            for name in ("train.csv", "test.csv", "sample_submission.csv"):
                pd.read_csv(Path(env["GPUPACK_DATA_DIR"]) / name)
            subprocess.run(argv, env={**os.environ, **env}, check=True)

        self.worker = threading.Thread(target=work, daemon=True)
        self.worker.start()
        return os.getpid()

    def wait(self):
        self.worker.join()


def timed_actors(make, probe, n: int = 1) -> float:
    """Seconds from creating ``n`` actors with ``make(i)`` until every ``probe(actor)`` answered; then kills them."""
    t0 = time.perf_counter()
    actors = [make(i) for i in range(n)]
    ray.get([ref for a in actors for ref in probe(a)])
    dt = time.perf_counter() - t0
    for a in actors:
        ray.kill(a)
    return dt


def bare_launch() -> float:
    return timed_actors(lambda _i: Bare.remote(), lambda a: [a.ping.remote()])


def gpupack_launch(i: int) -> float:
    """The executor's submit (the actor's resources, its device, its job's ``run``) until its first poll answers: the
    moment the driver marks a task RUNNING. (Its job starts at that answer, importing what it needs: a call made
    after it, such as ``environment``, waits on those imports, in gpupack or out.)"""
    from scheduler.execute.launch import LaunchRecord
    from scheduler.execute.ray_actor import RayExecutor

    spec = planmod.job_from_dict({"kind": "command", "name": "bench", "command": ["true"]})
    record = LaunchRecord(task=f"bench-{i}", job="bench", spec=spec, data_dir=".", workdir=".", metric="accuracy",
                          seed=0, cpus=1, node="local", device=0, gpu_memory_mib=4096)
    handles = {}

    def make(_i):
        handle = RayExecutor("bench").submit(record)
        handles[handle.actor] = handle
        return handle.actor

    # the handle's own first poll, the one the executor waits on (``RayExecutor.wait``); a second poll sent after it
    # queued behind the record's unpickling (its schema, the kind registry), which starts once the first answered
    return timed_actors(make, lambda a: [handles[a].poll_ref])


def bare_wave(n: int) -> float:
    return timed_actors(lambda _i: Bare.remote(), lambda a: [a.ping.remote()], n)


SCRIPT = [sys.executable, str(ROOT / "tests" / "scripts" / "fake_train.py")]
FOLDS, SLEEP = 2, "3"  # each job: two folds of three seconds


def bare_job_wave(n: int, data: Path, tmp: Path, k: int) -> float:
    """``n`` bare actors running the first wave's job themselves: created at once, until every one answered; then
    their scripts are waited for (the next sitting starts on a quiet machine, as gpupack's does)."""
    outs = [tmp / f"bare{k}" / f"j{i}" for i in range(n)]
    for o in outs:
        o.mkdir(parents=True)
    env = [{"GPUPACK_DATA_DIR": str(data), "GPUPACK_OUTPUT_DIR": str(o), "GPUPACK_FOLDS": str(FOLDS),
            "SLEEP": SLEEP} for o in outs]
    t0 = time.perf_counter()
    actors = [BareJob.remote() for _ in range(n)]
    ray.get([a.ping.remote(SCRIPT, e) for a, e in zip(actors, env)])
    dt = time.perf_counter() - t0
    ray.get([a.wait.remote() for a in actors])
    for a in actors:
        ray.kill(a)
    return dt


def gpupack_wave(n: int, data: Path, tmp: Path, k: int) -> float:
    jobs = [{"name": f"j{i}", "kind": "command", "command": SCRIPT, "folds": FOLDS,
             "resources": {"cpus": 1, "gpu_memory": "4GB"}, "env": {"SLEEP": SLEEP}} for i in range(n)]
    plan = planmod.from_dict({"name": "bench", "hardware": {"profile": "A100-40GB", "gpus_per_node": 2, "cpus": 16},
                              "budget": "5m", "jobs": jobs})
    dry = dryrun.prepare(plan, dryrun.resolve_hardware(plan))
    dry.data = datasource.inspect(datasource.choose(str(data), plan, tmp / "plan.yaml"), plan)  # as the CLI's dry
    # run does before its submit: the folder read and checked
    run_dir = tmp / f"run{k}"
    started = {}
    t0 = time.time()

    def watch():  # reads what the file gained since the last look: the watching costs the driver's process little
        offset = 0
        while len(started) < n:
            events, offset = events_from(run_dir / "events.jsonl", offset)
            for e in events:
                if e["event"] == "state" and e["new"] == "RUNNING":
                    started.setdefault(e["job"], e["time"])
            time.sleep(0.05)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    submit(dry, RunOptions(run_dir=run_dir, data_dir=data, dashboard=False, poll_s=0.1), lambda d: None,
           lambda d: None)
    w.join(10)
    if len(started) < n:
        raise RuntimeError(f"only {len(started)} of {n} jobs were seen RUNNING in {run_dir / 'events.jsonl'}")
    return max(started.values()) - t0


GOALS = {"launch": 1.05, "wave": 1.1}  # issue 31: gpupack's median over bare Ray's, at most


def figure(bare: list[float], ours: list[float], goal: float | None, **extra) -> dict:
    """One comparison: every run's seconds, the medians, their ratio and whether it meets ``goal`` (None: none)."""
    b, o = statistics.median(bare), statistics.median(ours)
    return {"runs": len(ours), "bare_s": [round(x, 4) for x in bare], "gpupack_s": [round(x, 4) for x in ours],
            "bare_median_s": round(b, 4), "gpupack_median_s": round(o, 4), "ratio": round(o / b, 3),
            "goal": goal, "met": None if goal is None else o / b <= goal, **extra}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=4, help="first-wave jobs (and bare actors) started at once")
    ap.add_argument("--repeats", type=int, default=5, help="runs of each figure, each side (at least 5)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = ap.parse_args()
    if args.repeats < 5:
        ap.error("--repeats: at least 5 (a median of fewer says little on a shared machine)")
    before = load()
    hw = hardware.from_profile("A100-40GB", gpus_per_node=2, cpus=16)
    ray.init(address="local", num_cpus=16, num_gpus=2, resources=runtime.device_resources(hw, 0.9),
             include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False)
    from jobs.data import write_digits

    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            data = write_digits(tmp / "digits")
            bare_launch(), gpupack_launch(-1)  # warm the worker pool alike
            bare, ours = [], []
            for i in range(args.repeats):
                bare.append(bare_launch())
                ours.append(gpupack_launch(i))
            idle, bw, gw = [], [], []
            for k in range(args.repeats):
                idle.append(bare_wave(args.jobs))
                bw.append(bare_job_wave(args.jobs, data, tmp, k))
                gw.append(gpupack_wave(args.jobs, data, tmp, k))
    finally:
        ray.shutdown()
    out = {"load_avg_before": before, "load_avg_after": load(), "cores": os.cpu_count(),
           "launch": figure(bare, ours, GOALS["launch"]),
           "wave": figure(bw, gw, GOALS["wave"], jobs=args.jobs),
           "wave_idle": figure(idle, gw, None, jobs=args.jobs)}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    la, wa = out["launch"], out["wave"]
    print(f"load average (1, 5, 15 min) {before} before, {out['load_avg_after']} after, on {out['cores']} cores")
    print(f"per job launch (median of {la['runs']}): bare Ray actor {la['bare_median_s'] * 1000:.0f} ms, gpupack job "
          f"actor {la['gpupack_median_s'] * 1000:.0f} ms: ratio {la['ratio']:.2f} (goal ≤ {la['goal']}: "
          f"{'met' if la['met'] else 'NOT met'})")
    wi = out["wave_idle"]
    print(f"{args.jobs} first-wave jobs, submit to all running (median of {wa['runs']}): bare actors running the same "
          f"job {wa['bare_median_s']:.2f} s, gpupack {wa['gpupack_median_s']:.2f} s: ratio {wa['ratio']:.2f} (goal ≤ "
          f"{wa['goal']}: {'met' if wa['met'] else 'NOT met'}; gpupack's includes writing the run folder and the "
          f"plan's placement; Ray was already up)")
    print(f"  against idle bare actors (they answer and do nothing): {wi['bare_median_s']:.2f} s, ratio "
          f"{wi['ratio']:.2f} (on {out['cores']} cores, the jobs that are up slow the start of the rest)")


if __name__ == "__main__":
    main()

"""A plan whose command job prints without pause: do its logs keep their bound, does ``logs`` show its last line,
and what does the driver hold meanwhile (issue 43: "a command job printing 1 GB: log files under their documented
bound, ``logs RUN JOB`` shows its last lines, the driver's RSS under 500 MB")?

It runs ``python -m scheduler submit PLAN --json`` as a user does (Ray, unless ``--in-process``) on the built-in
competition, with one command job: a script that prints ``--megabytes`` of 1 KiB lines, then trains as the tests'
``fake_train.py`` does (so the run ends in a submission), then prints its last line. While it runs, the driver's RSS (the ``submit`` process) is
sampled every 0.2 s, and the largest RSS of any process under it (the job's actor, the wrapper that bounds its log,
the script). Afterwards: the sizes of ``jobs/<job>/command/log`` and ``log.1`` against the bound
(``GPUPACK_LOG_MAX_BYTES``, default ``core.boundedlog.LOG_MAX_BYTES``), and the last line ``logs RUN JOB`` prints.

    python benchmarks/chatty.py [--megabytes 1024] [--in-process] [--workdir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scheduler.core import boundedlog  # noqa: E402

FAKE_TRAIN = ROOT / "tests" / "scripts" / "fake_train.py"
LAST = "THE-LAST-LINE"
GOAL_DRIVER_MIB = 500

CHATTY = """import sys
n = int(sys.argv[1]) << 10  # KiB lines
line = "x" * 1023 + "\\n"
for _ in range(n):
    sys.stdout.write(line)
sys.stdout.flush()
import runpy
sys.argv = sys.argv[2:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("{last}", flush=True)
"""


def plan_text(script: Path, megabytes: int) -> str:
    return (f"name: chatty\nhardware: A100-40GB\nbudget: 30m\njobs:\n  - name: talk\n    kind: command\n"
            f"    command: [{sys.executable}, {script}, '{megabytes}', {FAKE_TRAIN}]\n    folds: 2\n"
            "    resources: {cpus: 1, gpu_memory: 1GB}\n")


def watch(cmd: list[str], env: dict) -> dict:
    """Run ``cmd``; its exit code, wall, the driver's peak RSS and the largest peak RSS under it, in MiB."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    me = psutil.Process(proc.pid)
    driver = tree = 0
    while proc.poll() is None:
        try:
            driver = max(driver, me.memory_info().rss)
            for child in me.children(recursive=True):
                try:
                    tree = max(tree, child.memory_info().rss)
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        time.sleep(0.2)
    out, err = proc.communicate()
    return {"exit": proc.returncode, "wall_s": round(time.time() - t0, 1), "driver_peak_mib": driver >> 20,
            "largest_child_peak_mib": tree >> 20, "stdout": out, "stderr_tail": err[-1500:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--megabytes", type=int, default=1024, help="MiB the job prints before it trains")
    ap.add_argument("--in-process", action="store_true", help="submit --in-process (no Ray)")
    ap.add_argument("--workdir", type=Path, help="where the script and the run go (default: a temp folder)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="gpupack-chatty-"))
    work.mkdir(parents=True, exist_ok=True)
    script = work / "chatty.py"
    script.write_text(CHATTY.replace("{last}", LAST))
    plan = work / "plan.yaml"
    plan.write_text(plan_text(script, args.megabytes))
    run = work / "run"
    env = {**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "scheduler", "submit", str(plan), "--run-dir", str(run), "--json", "--no-dashboard"]
    cmd += ["--in-process"] if args.in_process else []
    print(f"submit: {' '.join(cmd[1:])} ({args.megabytes:,} MiB printed)", file=sys.stderr)
    result = watch(cmd, env)
    bound = boundedlog.max_bytes()
    folder = run / "jobs" / "talk" / "command"
    sizes = {p.name: p.stat().st_size for p in sorted(folder.glob("log*"))} if folder.is_dir() else {}
    logs = subprocess.run([sys.executable, "-m", "scheduler", "logs", str(run), "talk"], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    tail = logs.stdout.rstrip().splitlines()[-1:] or [""]
    summary = json.loads(result.pop("stdout").strip().splitlines()[-1]) if result["exit"] in (0, 1) else {}
    figures = {**result, "megabytes": args.megabytes, "in_process": args.in_process, "bound_bytes": bound,
               "log_files": sizes, "logs_last_line": tail[0][-200:], "status": summary.get("status"),
               "goals": {"logs_within_bound": bool(sizes) and all(s <= bound for s in sizes.values()),
                         "logs_shows_last_line": LAST in tail[0],
                         f"driver_under_{GOAL_DRIVER_MIB}_mib": result["driver_peak_mib"] < GOAL_DRIVER_MIB},
               "run_dir": str(run)}
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        for k in ("status", "exit", "wall_s", "driver_peak_mib", "largest_child_peak_mib", "bound_bytes", "log_files",
                  "logs_last_line", "goals"):
            print(f"{k:>24}: {figures[k]}")
    return 0 if all(figures["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())

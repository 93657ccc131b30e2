"""``doctor``: the check a GPU user runs first. Each check is a small real run on this machine, not a reading of
settings: what NVML and torch see; that a process capped at N MiB cannot take more and fails alone while its
neighbour goes on; that a forced out-of-memory error halves the batch and the fold finishes; each job kind's first
step; and the packing gain of two jobs on the card. Without a GPU it says what it could check (the batch loop on the
simulated device, LightGBM, a command job) and what it could not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

CAP_MIB = 1024  # the capped process may use this much
CAP_TRY_MIB = 2048  # and tries to take this much


@dataclass
class Check:
    name: str
    status: str  # "ok", "failed", "skipped"
    detail: str
    figures: dict = field(default_factory=dict)


def _run(name: str, fn: Callable[[], Check]) -> Check:
    start = time.perf_counter()
    try:
        check = fn()
    except Exception as e:  # a check that breaks is a failed check, reported, not a crash of the doctor
        check = Check(name, "failed", f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e) else ''}")
    check.figures["seconds"] = round(time.perf_counter() - start, 2)
    return check


def check_nvml() -> Check:
    from scheduler.core.hardware import NoGpuFound, read_gpus

    try:
        gpus = read_gpus()
    except NoGpuFound as e:
        return Check("nvml", "skipped", f"no GPU through NVML ({e})")
    text = "; ".join(f"{g.index}: {g.name}, {g.memory_mib:,} MiB, {g.used_mib or 0:,} used" for g in gpus)
    return Check("nvml", "ok", text, {"devices": [asdict(g) for g in gpus]})


def check_torch() -> Check:
    import torch

    if not torch.cuda.is_available():
        return Check("torch", "skipped", f"torch {torch.__version__}: CUDA not available (jobs run as CPU rehearsals)",
                     {"torch": torch.__version__, "cuda": False})
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    total = torch.cuda.get_device_properties(0).total_memory // 2**20
    return Check("torch", "ok", f"torch {torch.__version__}, CUDA {torch.version.cuda}: {', '.join(names)} "
                 f"({total:,} MiB), bf16 {'yes' if torch.cuda.is_bf16_supported() else 'no'}",
                 {"torch": torch.__version__, "cuda": torch.version.cuda, "devices": names, "total_mib": total})


_CAPPED = f"""
import json, torch
from scheduler.execute.apply import hold_to, process_cap
cap = process_cap({CAP_MIB}, None, cuda=True, torch_job=True)
hold_to(cap)
got = 0
try:
    blocks = [torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda") for _ in range({CAP_TRY_MIB} // 256)]
    got = {CAP_TRY_MIB}
    result = "not stopped"
except torch.cuda.OutOfMemoryError:
    result = "out of memory"
print(json.dumps({{"result": result, "allocator_mib": cap.allocator_mib, "fraction": cap.fraction,
                  "card_mib": cap.card_mib, "reserved_mib": torch.cuda.memory_reserved() / 2**20}}))
"""
_NEIGHBOUR = f"""
import json, torch
x = torch.empty({CAP_TRY_MIB} * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(json.dumps({{"result": "allocated", "mib": {CAP_TRY_MIB}}}))
"""


def check_cap() -> Check:
    import torch

    if not torch.cuda.is_available():
        return Check("memory cap", "skipped", "needs CUDA (the cap's arithmetic is tested on the CPU: "
                     "tests/test_gpu_path.py)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    capped = subprocess.Popen([sys.executable, "-c", _CAPPED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    neighbour = subprocess.Popen([sys.executable, "-c", _NEIGHBOUR], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env)
    results = []
    for p in (capped, neighbour):
        out, err = p.communicate(timeout=300)
        if p.returncode != 0:
            return Check("memory cap", "failed", f"a check process failed: {err.strip().splitlines()[-1:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    a, b = results
    ok = a["result"] == "out of memory" and b["result"] == "allocated"
    return Check("memory cap", "ok" if ok else "failed",
                 f"a process capped at {CAP_MIB:,} MiB ({a['allocator_mib']:,} for the allocator, {a['fraction']} of "
                 f"the {a['card_mib']:,} MiB card) asking for {CAP_TRY_MIB:,}: {a['result']}; its neighbour took "
                 f"{CAP_TRY_MIB:,} MiB at the same time: {b['result']}", {"capped": a, "neighbour": b})


def check_oom_recovery(workdir: Path) -> Check:
    """A real job whose batch cannot fit its share: it must halve until it fits and finish its fold."""
    import torch

    from jobs import JobContext, run_job
    from jobs.data import load_competition, write_digits
    from jobs.timm_kind import TimmJob
    from scheduler.execute.apply import hold_to, process_cap
    from scheduler.policy.memory.estimate import simulated_peak

    cuda = torch.cuda.is_available()
    comp = load_competition(write_digits(workdir / "digits"))
    events: list[tuple[str, dict]] = []
    share = 1200 if cuda else 2600  # ResNet-18 at 128 px: batch 512 needs several GiB; 64 fits
    spec = TimmJob(name="oom", kind="timm", model="resnet18", image_size=128, batch_size=512, epochs=100, folds=2,
                   grad_accum=1)
    cap = process_cap(share, None, cuda=cuda, torch_job=True)
    if cap is not None:  # as a job's process caps itself (execute.apply)
        hold_to(cap)
    ctx = JobContext("oom", workdir, cpus=2, device="cuda" if cuda else "cpu", rehearsal=not cuda,
                     gpu_memory_mib=share, cap=cap, simulated_peak=None if cuda else simulated_peak(spec),
                     report=lambda k, d: events.append((k, d)), limits=lambda: {"folds": 1, "epochs": 1})
    try:
        out = run_job(spec, comp, ctx)
    finally:
        if cuda:  # the job capped this process; the checks after it get the whole card back
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
            torch.cuda.empty_cache()
    halves = [d for k, d in events if k == "batch" and d["action"] in ("halve", "halve_eval")]
    path = " → ".join([str(spec.batch_size)] + [str(d["batch_size"]) for d in halves if d["action"] == "halve"])
    ok = bool(halves) and len(out.folds) == 1
    where = "on the card" if cuda else "on the simulated device (no CUDA)"
    return Check("OOM recovery", "ok" if ok else "failed",
                 f"ResNet-18 at batch 512 in a {share:,} MiB share {where}: batch {path}, fold finished "
                 f"(one epoch, {out.metric} {out.folds[0].score:.3f})" if out.folds else f"no fold finished; halvings: {path}",
                 {"batches": path, "halvings": len(halves), "simulated": not cuda})


def check_first_steps(workdir: Path) -> Check:
    """One real training step of each job kind on this machine."""
    import torch

    from jobs import JobContext, run_job
    from jobs.data import load_competition, write_digits
    from jobs.command_kind import CommandJob
    from jobs.lightgbm_kind import LightGBMJob

    comp = load_competition(write_digits(workdir / "digits-kinds"))
    parts, figures = [], {}
    t = time.perf_counter()
    lgb = run_job(LightGBMJob(name="lgbm", kind="lightgbm", folds=2, num_boost_round=20), comp,
                  JobContext("lgbm", workdir / "lgbm", cpus=2))
    figures["lightgbm_s"] = round(time.perf_counter() - t, 2)
    parts.append(f"lightgbm: 2 folds in {figures['lightgbm_s']} s, "
                 f"{lgb.throughput['train_samples_per_s']:,.0f} rows × rounds/s")
    if torch.cuda.is_available():
        import timm

        from jobs.memory import cuda_device

        dev = cuda_device("cuda")
        net = timm.create_model("resnet50", pretrained=False, num_classes=10).to(dev).to(
            memory_format=torch.channels_last)
        opt = torch.optim.AdamW(net.parameters())
        x = torch.randn(32, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (32,), device=dev)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        figures["timm_first_step_s"] = round(times[0], 3)
        figures["timm_step_s"] = round(sorted(times[1:])[1], 4)
        parts.append(f"timm: ResNet-50 b32 first step {times[0]:.2f} s, then {figures['timm_step_s'] * 1e3:.0f} ms "
                     f"({32 / figures['timm_step_s']:,.0f} images/s)")
        del net, opt, x, y
        torch.cuda.empty_cache()
    else:
        parts.append("timm: no CUDA (the OOM check above ran its steps on the CPU)")
    script = ("import os, json; print(json.dumps({k: os.environ.get(k) for k in "
              "('GPUPACK_GPU_MEMORY_MIB', 'GPUPACK_MEMORY_FRACTION', 'CUDA_VISIBLE_DEVICES')}))")
    out_dir = workdir / "cmd"
    cmd = CommandJob(name="cmd", kind="command", command=[sys.executable, "-c", script], folds=1)
    from jobs.command_job import environment
    from scheduler.execute.apply import process_cap

    # 4 GiB of an 80 GB card, capped as a command job's process caps it (execute.apply)
    ctx = JobContext("cmd", out_dir, cpus=1, gpu_memory_mib=4096,
                     cap=process_cap(4096, 80 * 1024, cuda=False, torch_job=False))

    env = environment(cmd, comp, ctx, out_dir)
    res = subprocess.run(cmd.command, env=env, capture_output=True, text=True, timeout=60)
    seen = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {}
    ok = seen.get("GPUPACK_GPU_MEMORY_MIB") == "4096"
    parts.append(f"command: started, saw GPUPACK_GPU_MEMORY_MIB={seen.get('GPUPACK_GPU_MEMORY_MIB')} "
                 f"GPUPACK_MEMORY_FRACTION={seen.get('GPUPACK_MEMORY_FRACTION')}")
    return Check("first steps", "ok" if ok and lgb.folds else "failed", "; ".join(parts), figures)


def check_gain(seconds: float) -> Check:
    import torch

    from scheduler.policy.timing import packgain

    if not torch.cuda.is_available():
        known = packgain.MEASURED[0]
        return Check("packing gain", "skipped", f"needs CUDA; the last measured: {known.gain}x for "
                     f"{' + '.join(f'{m} b{b}' for m, b in known.jobs)} ({known.source})")
    jobs = [("resnet50", 64), ("efficientnet_b0", 64)]
    m = packgain.measure(jobs, 224, seconds, warmup=5, card=torch.cuda.get_device_name(0))
    packgain.remember(m)
    return Check("packing gain", "ok",
                 f"ResNet-50 b64 + EfficientNet-B0 b64: alone {m.alone[0]:,.0f} and {m.alone[1]:,.0f} images/s, "
                 f"together {m.together[0]:,.0f} + {m.together[1]:,.0f}: {m.gain:.2f}x", asdict(m))


def run(gain_seconds: float = 8.0, skip_gain: bool = False) -> list[Check]:
    with tempfile.TemporaryDirectory(prefix="gpupack-doctor-") as tmp:
        work = Path(tmp)
        checks = [_run("nvml", check_nvml), _run("torch", check_torch), _run("memory cap", check_cap),
                  _run("OOM recovery", lambda: check_oom_recovery(work)),
                  _run("first steps", lambda: check_first_steps(work))]
        if skip_gain:
            checks.append(Check("packing gain", "skipped", "--no-gain"))
        else:
            checks.append(_run("packing gain", lambda: check_gain(gain_seconds)))
    return checks

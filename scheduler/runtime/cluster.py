"""Ray: start or join a cluster whose devices carry their GPU memory as resources, and one actor per job.

Each device is declared as a custom resource holding its memory in MiB up to the band's upper limit
(``gpupack_mem_<node>_<index>``). A job asks for its MiB of that one resource, so Ray itself refuses to over-commit a
device, even with several drivers on one cluster, and the resource's name pins the job to the node and device the
placement chose. Jobs take ``num_gpus=0`` (no fractional GPUs, which stall across nodes) and see their device through
``CUDA_VISIBLE_DEVICES``, set before anything touches CUDA.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from scheduler.core.actorline import ActorLine
from scheduler.core.hardware import Device, Hardware, Node

log = logging.getLogger("gpupack")
RESOURCE_PREFIX = "gpupack_mem_"  # gpupack_mem_<node>_<index>: the device's memory up to the band's top, MiB
TOTAL_PREFIX = "gpupack_total_"  # gpupack_total_<node>_<index>: the device's whole memory, MiB (never requested)
NODE_PREFIX = "gpupack_node_"  # gpupack_node_<node>: pins a CPU-only job to its node
NODE_SLOTS = 1000


def memory_resource(node: str, index: int) -> str:
    """The custom resource that holds device ``index`` of ``node``'s memory, in MiB."""
    return f"{RESOURCE_PREFIX}{node}_{index}"


def node_resource(node: str) -> str:
    return f"{NODE_PREFIX}{node}"


def safe_node_name(name: str) -> str:
    """A node name usable inside a resource name: letters, digits and underscores."""
    cleaned = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")
    return cleaned or "node"


def node_resources(node: str, devices: list[tuple[int, int]], band_high: float) -> dict[str, float]:
    """The custom resources one node declares: per device its memory up to the band's top and its total, and the
    node's own marker. ``devices`` are (index, total MiB)."""
    out: dict[str, float] = {node_resource(node): float(NODE_SLOTS)}
    for index, total in devices:
        out[memory_resource(node, index)] = float(int(total * band_high))
        out[f"{TOTAL_PREFIX}{node}_{index}"] = float(total)
    return out


def device_resources(hardware: Hardware, band_high: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in hardware.nodes:
        out.update(node_resources(n.name, [(d.index, d.memory_mib) for d in n.devices], band_high))
    return out


def cluster_hardware() -> Hardware:
    """The connected cluster's nodes and devices, read back from the resources its nodes declared."""
    nodes = []
    for info in ray.nodes():
        if not info.get("Alive"):
            continue
        res = info.get("Resources", {})
        names = [k[len(NODE_PREFIX):] for k in res if k.startswith(NODE_PREFIX)]
        if not names:
            continue
        name = names[0]
        devices = []
        for key, value in res.items():
            if key.startswith(f"{TOTAL_PREFIX}{name}_"):
                index = int(key.rsplit("_", 1)[1])
                devices.append(Device(name, index, int(value), "cluster"))
        nodes.append(Node(name, int(res.get("CPU", 0)), tuple(sorted(devices, key=lambda d: d.index))))
    if not nodes:
        from scheduler.core.errors import UserError

        raise UserError("the cluster declares no gpupack nodes; start each node with the flags that "
                        "`python -m scheduler node-resources` prints")
    return Hardware(profile="cluster", nodes=tuple(sorted(nodes, key=lambda n: n.name)), detected=True)


def connect(address: str) -> None:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)


@dataclass
class Cluster:
    started_here: bool
    address: str
    dashboard_url: str | None

    def stop(self) -> None:
        if self.started_here and ray.is_initialized():
            ray.shutdown()


def start(hardware: Hardware, band_high: float, address: str | None = None, dashboard: bool = True,
          object_store_mib: int = 256) -> Cluster:
    """Join ``address`` (``auto`` or HOST:PORT), or start a local Ray shaped like ``hardware``.

    A local Ray gets the profile's devices as logical GPUs and its cores as logical CPUs, whatever this machine has:
    packing and accounting are the plan's card's, even in a CPU rehearsal.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local, loopback-only clusters; see NOTES.md
    if ray.is_initialized():
        return Cluster(False, ray.get_runtime_context().gcs_address, _dashboard_url())
    if address:
        ctx = ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        missing = {k for k in device_resources(hardware, band_high) if k.startswith(RESOURCE_PREFIX)}
        missing -= set(ray.cluster_resources())
        if missing:
            ray.shutdown()
            from scheduler.core.errors import UserError

            raise UserError(
                f"the cluster at {address} does not declare the GPU memory resources this placement needs "
                f"({', '.join(sorted(missing))}); start its nodes with the flags of `python -m scheduler node-resources`"
            )
        return Cluster(False, address, _dashboard_url(ctx))
    ctx = ray.init(
        address="local",  # always a new local Ray, never one that `ray start` left running
        num_cpus=hardware.total_cpus,
        num_gpus=len(hardware.devices),
        resources=device_resources(hardware, band_high),
        include_dashboard=dashboard,
        object_store_memory=object_store_mib * 1024 * 1024,
        log_to_driver=False,
        logging_level=logging.WARNING,
        configure_logging=True,
    )
    return Cluster(True, ctx.address_info.get("gcs_address", ""), _dashboard_url(ctx))


def _dashboard_url(ctx: Any = None) -> str | None:
    url = getattr(ctx, "dashboard_url", None) if ctx is not None else None
    return f"http://{url}" if url else None


class _JobActor:
    """Runs one job in its own process and buffers what it reports, for the driver to poll.

    Threaded (``max_concurrency``>1) so that ``poll`` and ``cancel`` answer while ``run`` trains. Its ``repr`` is
    one line of its plan, task, fold, state and throughput (``core.actorline``), which the dashboard shows.
    """

    def __init__(self, job: str, cuda_visible_devices: str | None, env: dict[str, str], plan: str = "",
                 folds: int | None = None):
        if cuda_visible_devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        os.environ.update(env)
        self.job = job
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._stop = threading.Event()
        self._deadline: float | None = None
        self._limits: dict = {}
        self._line = ActorLine(plan, job, folds)

    def __repr__(self) -> str:
        return str(self._line)

    def _show(self, news: bool) -> None:
        """The line into the actor's log (the dashboard's actor page shows it) when it has news."""
        if news:
            print(self._line, flush=True)

    def environment(self) -> dict:
        """What the job sees: its device, its process, its node (for checks and telemetry)."""
        return {
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def _report(self, kind: str, fields: dict) -> None:
        with self._lock:
            self._events.append({"time": round(time.time(), 3), "event": kind, **fields})
            news = kind != "log" and self._line.note(kind, fields)
        self._show(news)

    def poll(self, since: int) -> list[dict]:
        with self._lock:
            return self._events[since:]

    def cancel(self) -> None:
        self._stop.set()
        self._show(self._line.set("STOPPING"))

    def set_limits(self, limits: dict) -> None:
        """The budget's cuts (``folds``, ``epochs``); the job reads them at its next fold or epoch."""
        self._limits = {**self._limits, **limits}
        self._show(self._line.set(cut=limits.get("folds")))

    def _should_stop(self) -> bool:
        return self._stop.is_set() or (self._deadline is not None and time.time() >= self._deadline)

    def run(self, spec: Any, data_dir: str, workdir: str, settings: dict) -> Any:
        from jobs import run_job
        from jobs.contract import JobContext
        from jobs import shelf
        from jobs.data import load_competition

        self._deadline = settings.get("deadline")
        folds = settings.get("folds")
        self._show(self._line.set("RUNNING", folds=len(folds) if folds else getattr(spec, "folds", None)))
        threads = int(settings["threads"])
        os.environ["OMP_NUM_THREADS"] = str(threads)
        cuda = False
        if spec.kind == "timm":  # a LightGBM or command actor never loads torch
            import torch

            torch.set_num_threads(threads)
            cuda = torch.cuda.is_available()
        else:
            cuda = nvml_sees_gpu()
        if settings.get("builtin") and not Path(data_dir, "train.csv").is_file():
            shelf.write(settings["builtin"], Path(data_dir))  # a node of a cluster without the built-in one yet
        handler = _BufferHandler(self._report)
        logger = logging.getLogger("gpupack.job")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            ctx = JobContext(
                name=self.job, workdir=Path(workdir), cpus=threads, device="cuda" if cuda else "cpu",
                rehearsal=not cuda, metric=settings["metric"], seed=settings["seed"], deadline=self._deadline,
                gpu_memory_mib=settings.get("gpu_memory_mib"),
                memory_fraction=job_memory_fraction(settings, cuda), memory_scale=settings.get("memory_scale") or 1.0,
                report=self._report, should_stop=self._should_stop, limits=lambda: dict(self._limits),
                kept_folds=settings.get("kept_folds") or {}, folds=settings.get("folds"),
            )
            Path(workdir).mkdir(parents=True, exist_ok=True)
            self._report("log", {"line": f"{self.job}: {'CUDA' if cuda else 'CPU rehearsal'}, {threads} thread(s), "
                                         f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}"})
            out = run_job(spec, load_competition(Path(data_dir), settings["metric"]), ctx)
            self._show(self._line.set("STOPPED" if self._should_stop() else "SUCCEEDED"))
            return out
        except BaseException:
            self._report("log", {"line": traceback.format_exc()})
            self._show(self._line.set("FAILED"))
            raise
        finally:
            logger.removeHandler(handler)


def job_memory_fraction(settings: dict, cuda: bool) -> float | None:
    """A job's share as a fraction of the card *in this process* (NVML's total for the device it sees), so a plan
    made for a smaller card caps the job at its planned MiB; on a rehearsal, of the plan's card."""
    planned = settings.get("memory_fraction")
    if planned is None or not cuda:
        return planned
    from scheduler.core.hardware import memory_fraction, physical_memory_mib, visible_index

    card = physical_memory_mib(visible_index(os.environ.get("CUDA_VISIBLE_DEVICES")))
    return memory_fraction(settings.get("gpu_memory_mib"), card) if card else planned


def nvml_sees_gpu() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    from scheduler.core.hardware import Nvml

    try:
        with Nvml() as nv:
            return nv.count() > 0
    except Exception:
        return False


class _BufferHandler(logging.Handler):
    def __init__(self, report):
        super().__init__()
        self._report_fn = report

    def emit(self, record: logging.LogRecord) -> None:
        self._report_fn("log", {"line": self.format(record)})


JobActor = ray.remote(_JobActor)


def launch(job: str, actor_name: str, cpus: int, node: str, device: int | None, gpu_memory_mib: int, *,
           env: dict[str, str] | None = None, devices: list[tuple[int, int]] | None = None, plan: str = "",
           folds: int | None = None):
    """Create the actor for ``job``: its cores, its MiB of its device's memory resource, its device visible.
    ``plan`` and ``folds`` (the task's) go into the actor's ``repr``."""
    if devices:  # whole devices (a multi-GPU job): all of each one's memory resource
        resources = {memory_resource(node, d): float(whole_mib) for d, whole_mib in devices}
        visible = ",".join(str(d) for d, _ in devices)
    elif device is not None and gpu_memory_mib:
        resources, visible = {memory_resource(node, device): float(gpu_memory_mib)}, str(device)
    else:
        resources, visible = {node_resource(node): 1.0}, None
    return JobActor.options(
        name=actor_name,
        num_cpus=cpus,
        num_gpus=0,
        resources=resources,
        max_concurrency=4,
        max_restarts=0,
    ).remote(job, visible, env or {}, plan, folds)

"""GPU profiles of the cards people rent, and what NVML says is really there.

A *profile* names a card model (``A100-40GB``); a *Hardware* is the cluster a plan is packed onto: nodes, each with
its CPU cores and devices. Memory is counted in integer MiB, and card names are read in GiB as the vendors mean them
(an A100-40GB has 40 × 1024 = 40,960 MiB).
"""

from __future__ import annotations

import math

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.core.errors import UserError


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_mib: int
    cpus_per_gpu: int  # vCPUs a typical one-card cloud instance gives beside one such card
    nvml_names: tuple[str, ...]  # substrings of the NVML device name that identify the card
    ram_gib_per_gpu: int = 64  # host RAM a typical one-card instance gives beside one such card


# cpus_per_gpu: what a typical rented one-card machine has (MLE-bench's A10 box has 36 vCPUs; Lambda's 1×A100-40GB
# 30; AWS g4dn.2xlarge 8; GCP g2-standard-16 16; one eighth of an 8-card H100/H200 box 26/32).
# ram_gib_per_gpu, the same machines' host RAM: g4dn.2xlarge 32 GiB; MLE-bench's A10 box 440 GB; g2-standard-16 64 GB;
# a rented 3090/4090 box 32–64 GiB; p3.2xlarge (V100-16GB) 61 GiB; Lambda's 1×A100-40GB 200 GiB, 1×A100-80GB/H100
# ~225 GiB (an eighth of a 1.8 TiB 8-card box); an eighth of a 2 TiB H200 box 256 GiB.
PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in [
        GpuProfile("T4-16GB", 16 * 1024, 8, ("T4",), 32),
        GpuProfile("A10-24GB", 24 * 1024, 36, ("A10",), 440),
        GpuProfile("L4-24GB", 24 * 1024, 16, ("L4",), 64),
        GpuProfile("RTX3090-24GB", 24 * 1024, 16, ("3090",), 48),
        GpuProfile("RTX4090-24GB", 24 * 1024, 16, ("4090",), 48),
        GpuProfile("V100-16GB", 16 * 1024, 8, ("V100-SXM2-16GB", "V100-PCIE-16GB", "V100 16"), 61),
        GpuProfile("V100-32GB", 32 * 1024, 8, ("V100-SXM2-32GB", "V100-PCIE-32GB", "V100S"), 61),
        GpuProfile("L40S-48GB", 48 * 1024, 32, ("L40S",), 128),
        GpuProfile("A100-40GB", 40 * 1024, 30, ("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 40"), 200),
        GpuProfile("A100-80GB", 80 * 1024, 30, ("A100-SXM4-80GB", "A100-PCIE-80GB", "A100 80", "A100 80GB"), 225),
        GpuProfile("H100-80GB", 80 * 1024, 26, ("H100",), 225),
        GpuProfile("H200-141GB", 141 * 1024, 32, ("H200",), 256),
    ]
}

LOCAL_NODE = "local"
MAX_GPUS_PER_NODE = 64  # the plan schema's own limit; the largest boxes sold hold 8–16
MAX_DEVICES = 256  # in all: the packer's exact search stays within seconds up to here


@dataclass(frozen=True)
class Device:
    node: str
    index: int
    memory_mib: int
    name: str = ""
    # MiB others hold on it now (a slot of the service, another plan's tasks), read from Ray when a plan joins a
    # running cluster (``runtime.cluster.cluster_hardware``): the packer packs around it
    held_mib: int = 0

    def limit_mib(self, high: float) -> int:
        """What a plan may pack on it: the band's top of the card, less what others hold now."""
        return max(0, math.floor(self.memory_mib * high + 1e-9) - self.held_mib)

    @property
    def key(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    devices: tuple[Device, ...] = ()
    memory_mib: int | None = None  # host RAM the node's tasks may hold (MiB); None: not known, not packed
    # where memory_mib came from, in words the dry run prints ("cgroup limit", "this machine's RAM", "profile
    # A10-24GB's typical", "given"); None: not said (a cluster's nodes, as Ray declares them)
    memory_source: str | None = None
    # where cpus came from when it is not the profile's (``with_local_cores``: this machine's), in the dry run's words
    cpus_source: str | None = None

    def with_(self, **changes) -> "Node":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class Hardware:
    """What a plan is packed onto. ``profile`` is the card model's name (or the detected card's)."""

    profile: str
    nodes: tuple[Node, ...]
    detected: bool = False  # True when read from NVML, False when taken from a profile
    notes: tuple[str, ...] = field(default=())

    @property
    def devices(self) -> tuple[Device, ...]:
        return tuple(d for n in self.nodes for d in n.devices)

    @property
    def total_cpus(self) -> int:
        return sum(n.cpus for n in self.nodes)

    def to_json(self) -> dict:
        return {
            "profile": self.profile,
            "devices": [{"node": d.node, "index": d.index, "memory_mib": d.memory_mib} for d in self.devices],
            "nodes": [{"node": n.name, "cpus": n.cpus, "gpus": len(n.devices), "memory_mib": n.memory_mib,
                       "memory_source": n.memory_source, "cpus_source": n.cpus_source} for n in self.nodes],
        }


_SPEC = re.compile(r"^(?:(?P<nodes>\d{1,9})x(?=\d+x))?(?:(?P<gpus>\d{1,9})x)?(?P<name>[A-Za-z][A-Za-z0-9\-]*)$")


def profile(name: str) -> GpuProfile:
    """The profile called ``name`` (case-insensitive), or a UserError that suggests the nearest."""
    for key, p in PROFILES.items():
        if key.lower() == name.lower():
            return p
    near = difflib.get_close_matches(name.upper(), list(PROFILES), n=1, cutoff=0.3)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise UserError(f"unknown hardware profile '{name}'{hint}; known: {', '.join(PROFILES)}, auto")


def from_profile(name: str, gpus_per_node: int | None = None, nodes: int = 1, cpus: int | None = None,
                 memory_mib: int | None = None) -> Hardware:
    """A cluster of ``nodes`` identical nodes with ``gpus_per_node`` cards of profile ``name``, each node with
    ``memory_mib`` of host RAM (default: the profile's typical RAM per card times the cards).

    ``name`` may carry the counts itself: ``4xA100-80GB`` (4 cards on one node), ``2x4xA100-80GB`` (2 nodes of 4).
    """
    m = _SPEC.match(name.strip()) if len(name) <= 100 else None
    if m is None:
        raise UserError(f"hardware '{name}' is not a profile name like A100-40GB, 4xA100-80GB or 2x4xA100-80GB")
    if m.group("nodes"):
        nodes = int(m.group("nodes"))
    if m.group("gpus"):
        gpus_per_node = int(m.group("gpus"))
    gpus_per_node = 1 if gpus_per_node is None else gpus_per_node
    if gpus_per_node < 1 or nodes < 1:
        raise UserError(f"hardware '{name}': node and GPU counts must be at least 1 (no GPU at all is no profile: "
                        "a CPU machine rehearses on the profile's logical GPUs)")
    if gpus_per_node > MAX_GPUS_PER_NODE:
        raise UserError(f"hardware '{name}': {gpus_per_node:,} GPUs on one node; at most {MAX_GPUS_PER_NODE}")
    if nodes * gpus_per_node > MAX_DEVICES:
        raise UserError(f"hardware '{name}': {nodes:,} node(s) × {gpus_per_node} GPU(s) = {nodes * gpus_per_node:,} "
                        f"GPUs; at most {MAX_DEVICES} in all")
    p = profile(m.group("name"))
    node_cpus = cpus if cpus is not None else p.cpus_per_gpu * gpus_per_node
    typical = p.ram_gib_per_gpu * 1024 * gpus_per_node
    node_names = [LOCAL_NODE] if nodes == 1 else [f"node{i}" for i in range(nodes)]
    built = tuple(
        Node(n, node_cpus, tuple(Device(n, i, p.memory_mib, p.name) for i in range(gpus_per_node)), typical,
             f"profile {p.name}'s typical")
        for n in node_names
    )
    return with_host_ram(Hardware(profile=p.name, nodes=built), memory_mib)


# --- NVML ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuReading:
    """One device as NVML sees it now. Figures NVML does not give are None."""

    index: int
    name: str
    memory_mib: int
    used_mib: int | None
    free_mib: int | None
    utilization: float | None = None  # 0..1


class NoGpuFound(RuntimeError):
    """NVML is missing, fails to start, or sees no device."""


class Nvml:
    """The one NVML reader: NVML started on opening and shut down on ``close`` (or at the end of a ``with`` block),
    the devices, their memory and the memory of each process on them. ``nvml`` is the ``pynvml`` module (from
    nvidia-ml-py), or a fake of it in tests. Raises NoGpuFound when NVML is missing or cannot start."""

    def __init__(self, nvml=None):
        if nvml is None:
            try:
                import pynvml as nvml  # from nvidia-ml-py
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NoGpuFound("nvidia-ml-py is not installed") from e
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            raise NoGpuFound(f"NVML could not start ({e}): no NVIDIA driver on this machine") from e
        self.lib = nvml

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except Exception:
            pass

    def __enter__(self) -> "Nvml":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def count(self) -> int:
        return self.lib.nvmlDeviceGetCount()

    def handle(self, device: int | str):
        """A device by NVML index or by UUID (``GPU-…``)."""
        if isinstance(device, str):
            return self.lib.nvmlDeviceGetHandleByUUID(device)
        return self.lib.nvmlDeviceGetHandleByIndex(device)

    def name(self, handle) -> str:
        name = self.lib.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)

    def memory(self, handle):
        """NVML's memory figures of a device, in bytes (``total``, ``used``, ``free``)."""
        return self.lib.nvmlDeviceGetMemoryInfo(handle)

    def utilization(self, handle) -> float | None:
        """The device's busy fraction, 0..1; None when the driver does not give it."""
        try:
            return self.lib.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        except Exception:
            return None

    def process_bytes(self, handle) -> list[tuple[int, int]]:
        """(pid, bytes) for each compute process on a device whose memory NVML reports."""
        return [(p.pid, used) for p in self.lib.nvmlDeviceGetComputeRunningProcesses(handle)
                if (used := getattr(p, "usedGpuMemory", None)) is not None]


def read_gpus(nvml=None) -> list[GpuReading]:
    """Every device NVML sees. ``nvml`` is the ``pynvml`` module (or a fake of it in tests)."""
    mib = 1024 * 1024
    with Nvml(nvml) as nv:
        out = []
        for i in range(nv.count()):
            h = nv.handle(i)
            mem = nv.memory(h)
            out.append(GpuReading(i, nv.name(h), int(mem.total // mib), int(mem.used // mib), int(mem.free // mib),
                                  nv.utilization(h)))
    if not out:
        raise NoGpuFound("NVML started but sees no GPU")
    return out


def profile_for(nvml_name: str) -> GpuProfile | None:
    """The profile whose NVML name pattern matches ``nvml_name`` best (longest pattern wins)."""
    best: tuple[int, GpuProfile] | None = None
    for p in PROFILES.values():
        for pat in p.nvml_names:
            if pat.lower() in nvml_name.lower() and (best is None or len(pat) > best[0]):
                best = (len(pat), p)
    return best[1] if best else None


def card_name(name: str | None) -> str:
    """A hardware profile name for ``name`` (a profile, or an NVML device name such as 'NVIDIA H100 80GB HBM3'),
    so that figures recorded under either name are found under one; unknown names come back stripped."""
    if not name:
        return ""
    for key in PROFILES:
        if key.lower() == name.strip().lower():
            return key
    p = profile_for(name)
    return p.name if p else name.strip()


def detect(nvml=None) -> Hardware:
    """This machine's GPUs as one node, with the memory NVML reports. Raises UserError when there is none."""
    try:
        readings = read_gpus(nvml)
    except NoGpuFound as e:
        raise UserError(
            f"hardware 'auto': no GPU found ({e}). Name a profile instead, e.g. --hardware A100-40GB "
            "(without a GPU, jobs run as a CPU rehearsal)"
        ) from e
    names = {r.name for r in readings}
    prof = profile_for(readings[0].name)
    label = prof.name if prof and len(names) == 1 else " + ".join(sorted(names))
    devices = tuple(Device(LOCAL_NODE, r.index, r.memory_mib, r.name) for r in readings)
    return with_host_ram(Hardware(profile=label, nodes=(Node(LOCAL_NODE, usable_cores()[0], devices),),
                                  detected=True), local=True)


CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
LOCAL_RAM, CGROUP_LIMIT, GIVEN = "this machine's RAM", "cgroup limit", "given"


def _cgroup_dirs(root: Path, controller: str) -> list[Path]:
    """The folders of the cgroups this process is in, for ``controller`` (``memory``, ``cpu``), from the hierarchy's
    top down to its own (``/proc/self/cgroup``: ``0::/a/b`` for v2, ``4:memory:/a/b`` for v1), under ``root``
    (``/``, or a fake tree in a test). A v1 hierarchy is mounted at ``sys/fs/cgroup/<its controllers>`` (``cpu,cpuacct``)
    or at one of its names; a container whose namespace hides its parents sees its own cgroup at the mount itself, so
    the mount's folder is always one of them. Folders that are not there are left out."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    base = root / "sys/fs/cgroup"
    out: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        names = [c for c in controllers.split(",") if c]
        if not names:  # v2: one hierarchy, at the mount (``unified`` beside v1's, on a hybrid host)
            mounts = [base / "unified", base]
        elif controller in names:
            mounts = [base / controllers, *(base / c for c in names)]
        else:
            continue
        steps = [p for p in path.strip().split("/") if p and p != ".."]
        for mount in mounts:
            if not mount.is_dir():
                continue
            here = mount
            out.append(here)
            for step in steps:
                here = here / step
                if here.is_dir():
                    out.append(here)
            break
    for fallback in (base, base / controller):  # no /proc/self/cgroup (or a fake tree without one): the mount's own
        if fallback.is_dir() and fallback not in out:
            out.append(fallback)
    return out


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2: no limit) and the unreadable are no figure


def cgroup_memory_bytes(root: str | Path = "/") -> int | None:
    """The least host RAM any cgroup this process is in allows (v2 ``memory.max``, v1 ``memory.limit_in_bytes``,
    each level of a nested one: a limit set on a parent holds its children too), or None when none sets one. A
    nested v1 cgroup of 8 GiB under a root of 24 GB was once read as 24 GB (the root's file alone)."""
    found = [n for d in _cgroup_dirs(Path(root), "memory")
             for n in (_read_int(d / "memory.max"), _read_int(d / "memory.limit_in_bytes")) if n]
    return min(found) if found else None


def _quota_cores(d: Path) -> float | None:
    """The cores a cgroup's CPU quota allows: v2 ``cpu.max`` (``QUOTA PERIOD``, ``max`` for none), v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 for none)."""
    try:
        quota, period = ((d / "cpu.max").read_text().split() + ["", ""])[:2]
        if quota.isdigit() and period.isdigit() and int(period) > 0:
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text().strip())
        period = int((d / "cpu.cfs_period_us").read_text().strip())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def usable_cores(root: str | Path = "/", affinity: set[int] | None = None) -> tuple[int, str]:
    """The cores this process may use, and in words what set them: its CPU affinity (``os.sched_getaffinity``:
    ``taskset``, a job scheduler's binding; ``affinity`` in a test), capped by the least CPU quota of the cgroups it is
    in (v2 ``cpu.max``, v1 CFS quota, each level; a quota of 1.5 cores is 1 core's threads: rounded down, at least
    1). Not ``os.cpu_count()``, the host's."""
    if affinity is None:
        try:
            affinity = os.sched_getaffinity(0)
        except (AttributeError, OSError):  # not Linux
            affinity = set(range(os.cpu_count() or 1))
    cores, source = max(1, len(affinity)), "CPU affinity"
    quotas = [q for d in _cgroup_dirs(Path(root), "cpu") if (q := _quota_cores(d)) is not None]
    if quotas and max(1, math.floor(min(quotas) + 1e-9)) < cores:
        cores, source = max(1, math.floor(min(quotas) + 1e-9)), "cgroup CPU quota"
    return cores, source


def local_memory(limits: tuple[str, ...] | None = None, root: str | Path = "/") -> tuple[int | None, str]:
    """This machine's host RAM (psutil), or the container's limit when one is lower (the least of the cgroups this
    process is in, v2 and v1, nested: :func:`cgroup_memory_bytes` under ``root``; ``limits``: files to read instead,
    as a test points them elsewhere), with which of the two it is: a 5 GiB container on a 64 GiB host OOM-kills at
    5 GiB, so 5 GiB is what packs."""
    try:
        import psutil

        total = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001 -- psutil is Ray's dependency; without it, no RAM figure, nothing packed
        return None, LOCAL_RAM
    source = LOCAL_RAM
    found = [n for path in (CGROUP_LIMITS if limits is None else limits) if (n := _read_int(Path(path)))]
    if limits is None and (n := cgroup_memory_bytes(root)):  # each level of the cgroups it is in, nested ones too
        found.append(n)
    for n in found:
        if n < total:
            total, source = n, CGROUP_LIMIT
    return total // (1024 * 1024), source


def local_memory_mib(limits: tuple[str, ...] | None = None) -> int | None:
    """``local_memory``'s figure alone."""
    return local_memory(limits)[0]


def with_host_ram(hardware: Hardware, given: int | None = None, local: bool = False) -> Hardware:
    """Each node's host RAM, the rule written once: a figure the person gave (the plan's ``hardware.memory``) wins;
    a plan that runs on this machine packs against what this machine gives the process (``local_memory``: the
    cgroup limit, else the physical RAM), shared evenly by the nodes a local Ray stands up on it, since a profile's
    typical 440 GiB packed on a 5 GiB container had folds OOM-killed; else the nodes keep their own figure (a
    profile's typical, or what a cluster's nodes declared to Ray)."""
    if given is not None:
        mib, source = given, GIVEN
    elif local:
        mib, source = local_memory()
        if mib is not None and len(hardware.nodes) > 1:
            mib, source = mib // len(hardware.nodes), f"{source}, shared by {len(hardware.nodes)} nodes"
    else:
        return hardware
    if mib is None:
        return hardware
    return dataclasses.replace(hardware, nodes=tuple(n.with_(memory_mib=mib, memory_source=source)
                                                     for n in hardware.nodes))


LOCAL_CORES = "this machine's"


def with_local_cores(hardware: Hardware, least: int = 1, cores: tuple[int, str] | None = None) -> Hardware:
    """Each node's cores where the plan runs on this machine, the rule written once: the fewer of the node's own
    (the profile's typical, or the detected machine's) and what this process is given (``usable_cores``: its CPU
    affinity, capped by its cgroup's CPU quota; ``cores`` in a test), shared evenly by the nodes a local Ray stands up
    on it (as host RAM is), since a dry run of an A10-24GB plan once counted the profile's 36 cores on a 2-core
    machine; but never fewer than ``least`` (the most one job of the plan asks), so that a plan that packs on the
    profile still packs here (that job runs on the cores there are: its threads are capped at the machine's). A card
    seen or not: a CPU rehearsal packs this machine's cores as a run on the card does (issue 55: a rehearsal that
    packed the profile's 30 on 2 counted 20 cores busy in one wave). The node says the profile's figure it capped.
    A plan that names its ``hardware.cpus`` keeps them (the caller does not call this)."""
    have, why = cores or usable_cores()
    per = max(1, have // max(1, len(hardware.nodes)))
    shared = f", shared by {len(hardware.nodes)} nodes" if len(hardware.nodes) > 1 else ""
    nodes = []
    for n in hardware.nodes:
        if per >= n.cpus:
            nodes.append(n)
            continue
        count = max(per, min(n.cpus, least))
        said = f"{LOCAL_CORES}: {have} by its {why}{shared}, the profile's {n.cpus} capped to them"
        if count > per:
            said += f"; {count}, the most one job asks"
        nodes.append(n.with_(cpus=count, cpus_source=said))
    return dataclasses.replace(hardware, nodes=tuple(nodes))


def resolve(spec: str, gpus_per_node: int | None = None, nodes: int = 1, cpus: int | None = None, nvml=None,
            memory_mib: int | None = None, *, local: bool = False, least_cpus: int | None = None) -> Hardware:
    """``auto`` detects through NVML; anything else is a profile name. Host RAM per node (``with_host_ram``):
    ``memory_mib`` when given, else this machine's when the plan runs here (``local``, or ``auto``, which is this
    machine by definition), else the profile's typical figure. Cores per node: ``cpus`` when given, else, for a plan
    run here (``local`` with ``least_cpus``, the most one of its jobs asks), on a card or rehearsed on the CPU, the
    fewer of the profile's and this machine's (``with_local_cores``), else the profile's."""
    if spec.strip().lower() == "auto":
        hw = detect(nvml)
        if cpus is not None:
            hw = dataclasses.replace(hw, nodes=tuple(n.with_(cpus=cpus) for n in hw.nodes))
    else:
        hw = from_profile(spec, gpus_per_node=gpus_per_node, nodes=nodes, cpus=cpus)
    if local and cpus is None and least_cpus is not None:  # a plan run here: this machine's cores (with_local_cores)
        hw = with_local_cores(hw, least_cpus)
    return with_host_ram(hw, memory_mib, local=local)


# --- a job's share of the card that is really there ----------------------------------------------------------------


def visible_index(cuda_visible_devices: str | None, ordinal: int = 0) -> int | str | None:
    """The physical device behind CUDA ordinal ``ordinal`` of a process: an NVML index, a UUID (``GPU-…``), or None
    when the process sees every device in order (then the ordinal is the index)."""
    if cuda_visible_devices is None:
        return ordinal
    entries = [e.strip() for e in cuda_visible_devices.split(",") if e.strip()]
    if ordinal >= len(entries):
        return None
    entry = entries[ordinal]
    return int(entry) if entry.isdigit() else entry


def physical_memory_mib(device: int | str | None, nvml=None) -> int | None:
    """Total memory of one physical device (an NVML index or UUID) as NVML reports it; None when NVML cannot say."""
    if device is None:
        return None
    try:
        with Nvml(nvml) as nv:
            return int(nv.memory(nv.handle(device)).total // (1024 * 1024))
    except Exception:
        return None

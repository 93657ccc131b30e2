"""Ray: start or join a cluster whose devices carry their GPU memory as resources (the jobs' actors are
``scheduler.execute.ray_actor``'s).

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
from dataclasses import dataclass
from typing import Any

import ray

from scheduler.core.hardware import Device, Hardware, Node
from scheduler.execute.apply import nvml_sees_gpu  # noqa: F401 -- the runtime's question too
from scheduler.execute.resources import (NODE_PREFIX, NODE_SLOTS, RESOURCE_PREFIX, TOTAL_PREFIX,  # noqa: F401
                                         memory_resource, node_resource)

log = logging.getLogger("gpupack")


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
    free = ray.available_resources()
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
                declared = res.get(memory_resource(name, index), 0.0)  # others' share of it is held now
                held = max(0, int(declared - free.get(memory_resource(name, index), declared)))
                devices.append(Device(name, index, int(value), "cluster", held_mib=held))
        ram = int(res.get("memory", 0)) // (1024 * 1024) or None  # Ray's ``memory`` resource: bytes tasks may hold
        nodes.append(Node(name, int(res.get("CPU", 0)), tuple(sorted(devices, key=lambda d: d.index)), ram))
    if not nodes:
        from scheduler.core.errors import UserError

        raise UserError("the cluster declares no gpupack nodes; start each node with the flags that "
                        "`python -m scheduler node-resources` prints")
    return Hardware(profile="cluster", nodes=tuple(sorted(nodes, key=lambda n: n.name)), detected=True)


CONNECT_TIMEOUT_S = 30.0  # how long a Ray head named by --address may take to answer before the run is refused


def check_reachable(address: str, timeout_s: float | None = None) -> None:
    """Refuse (one line, exit 2) a ``HOST:PORT`` where no Ray head answers within ``CONNECT_TIMEOUT_S``: Ray itself
    waits for a head that is not there without end. ``auto`` (the head this machine started) is Ray's to find."""
    import socket
    import time

    from scheduler.core.errors import UserError

    target = address.split("://", 1)[-1]
    if target == "auto" or ":" not in target:
        return
    host, _, port = target.rpartition(":")
    if not port.isdigit():
        raise UserError(f"--address: expected auto or HOST:PORT, got {address!r}")
    limit = CONNECT_TIMEOUT_S if timeout_s is None else timeout_s
    deadline, why = time.monotonic() + limit, "no answer"
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, min(5.0, limit))):
                return
        except OSError as e:
            why = e.strerror or str(e) or type(e).__name__
        if time.monotonic() >= deadline:
            raise UserError(f"--address {address}: no Ray head answers there within {limit:g} s ({why}); start it "
                            f"(`ray start --head`) or use --address auto")
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))


def connect(address: str) -> Any:
    """Join the Ray cluster at ``address``: one line (exit 2, as ``check_reachable``'s) where it cannot be joined."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if not ray.is_initialized():
        check_reachable(address)
        return _init(address, address=address, log_to_driver=False, logging_level=logging.WARNING)
    return None


IN_PROCESS = "`--in-process` runs the plan without Ray"


def _init(joining: str | None, **kwargs: Any) -> Any:
    """``ray.init(**kwargs)``; where it raises, whatever it started is stopped and the failure said in one line with
    Ray's reason (``--debug`` shows Ray's traceback): joining a cluster (``joining``, the ``--address``), a
    ``UserError`` (exit 2); starting a local Ray, a ``StartFailure`` (exit 1: the machine's, not the person's)."""
    import psutil

    from scheduler.core.errors import StartFailure, UserError

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        return ray.init(**kwargs)
    except Exception as e:
        ray.shutdown()  # a no-op unless the driver got as far as connecting
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        for p in left:  # a Node whose start failed is never stopped by Ray: its GCS, raylet, reaper, agents
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=5)
        if joining:
            raise UserError(f"--address {joining}: no Ray cluster could be joined there ({_why(e)}); start it "
                            f"(`ray start --head`) or leave --address out; {IN_PROCESS}") from e
        raise StartFailure(f"a local Ray could not be started: {_why(e)}; {IN_PROCESS}") from e


def _why(e: Exception) -> str:
    """Ray's reason in a few words: its two start-up timeouts named, else its message's first sentence."""
    text = " ".join(str(e).split())
    if "timed out during startup" in text:  # ray/_private/node.py: the raylet's wait, 30 s, fixed
        return ("its node did not start within 30 s (the raylet did not register with the GCS; is the machine "
                "overloaded?)")
    if re.search(r"Timed out waiting for file \S*gcs_server_port", text):  # the GCS's port file
        wait = os.environ.get("RAY_gcs_server_port_wait_time_s")
        return (f"its GCS server did not start within {wait} s (RAY_gcs_server_port_wait_time_s)" if wait else
                "its GCS server did not start in time (is the machine overloaded?)")
    first = re.split(r"(?<=[.!?])\s", text, maxsplit=1)[0]
    return f"{type(e).__name__}: {first[:200]}" if first else type(e).__name__


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

    A local Ray gets the profile's devices as logical GPUs, its cores as logical CPUs and its nodes' host RAM as Ray's
    ``memory`` resource, whatever this machine has: packing and accounting are the plan's card's, even in a CPU
    rehearsal (``hardware auto`` reads this machine's RAM, its container's limit included).
    """
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local, loopback-only clusters; see NOTES.md
    if ray.is_initialized():
        return Cluster(False, ray.get_runtime_context().gcs_address, _dashboard_url())
    if address:
        ctx = connect(address)
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
    ctx = _init(
        None,
        address="local",  # always a new local Ray, never one that `ray start` left running
        num_cpus=hardware.total_cpus,
        num_gpus=len(hardware.devices),
        resources=device_resources(hardware, band_high),
        **({"_memory": ram * 1024 * 1024} if (ram := sum(n.memory_mib or 0 for n in hardware.nodes)) else {}),
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

"""Nodes that come and go during a run: where a job goes when its node is lost, and whether a waiting job can move to
a node that joined. Read from Ray's view of the per-device memory resources; the choice itself is pure (best fit)."""

from __future__ import annotations

import re

import ray

from scheduler.policy.placement.placement_online import tightest
from scheduler.runtime.cluster import NODE_PREFIX, RESOURCE_PREFIX

DeviceKey = tuple[str, int]


# Ray names a placement group's share of a resource ``<resource>_group_<pg id hex>`` and, per bundle,
# ``<resource>_group_<bundle index>_<pg id hex>``: the slot service's groups add such names beside a device's own
PLACEMENT_GROUP = re.compile(r"_group_(?:\d+_)?[0-9a-f]{16,}$")
DEVICE = re.compile(r"^(?P<node>[A-Za-z0-9_]+)_(?P<index>\d+)$")


def _devices(resources: dict) -> dict[DeviceKey, float]:
    """Each device's own memory resource (``gpupack_mem_<node>_<index>``), parsed strictly: a placement group's
    names for it (a slot the service granted) are not devices, and were once read as one (``int('<hex>')``: the
    plan crashed with a ValueError beside a granted slot). What a group holds is already taken off the device's own
    resource, so the free MiB read here are what the slots left."""
    out = {}
    for key, value in resources.items():
        if not key.startswith(RESOURCE_PREFIX) or PLACEMENT_GROUP.search(key):
            continue
        m = DEVICE.match(key[len(RESOURCE_PREFIX):])
        if m:
            out[(m["node"], int(m["index"]))] = value
    return out


def capacity() -> dict[DeviceKey, float]:
    """Every alive device's memory limit, MiB."""
    return _devices(ray.cluster_resources())


def free() -> dict[DeviceKey, float]:
    """Every alive device's memory not held by any actor now, MiB (devices with nothing free are absent)."""
    return _devices(ray.available_resources())


def alive_nodes() -> set[str]:
    return {k[len(NODE_PREFIX):] for k in ray.cluster_resources() if k.startswith(NODE_PREFIX)}


def best_fit(mib: float, room: dict[DeviceKey, float], avoid: set[DeviceKey] = frozenset()) -> DeviceKey | None:
    """The device where ``mib`` fits leaving the least room; ties to the lower node name and index."""
    return tightest(mib, {key: left for key, left in room.items() if key not in avoid})

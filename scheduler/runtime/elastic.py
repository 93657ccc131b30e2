"""Nodes that come and go during a run: where a job goes when its node is lost, and whether a waiting job can move to
a node that joined. Read from Ray's view of the per-device memory resources; the choice itself is pure (best fit)."""

from __future__ import annotations

import ray

from scheduler.policy.placement_online import tightest
from scheduler.runtime.cluster import NODE_PREFIX, RESOURCE_PREFIX

DeviceKey = tuple[str, int]


def _devices(resources: dict) -> dict[DeviceKey, float]:
    out = {}
    for key, value in resources.items():
        if key.startswith(RESOURCE_PREFIX):
            node, index = key[len(RESOURCE_PREFIX):].rsplit("_", 1)
            out[(node, int(index))] = value
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

"""The names of the custom resources a gpupack node declares in Ray, which a job's request spends.

Each device's memory up to the band's top is ``gpupack_mem_<node>_<index>`` (MiB), its whole memory
``gpupack_total_<node>_<index>`` (never requested, read back to learn the card), and ``gpupack_node_<node>`` pins a
CPU-only job to its node. Named here, below the runtime that declares them and the backends that request them.
"""

from __future__ import annotations

RESOURCE_PREFIX = "gpupack_mem_"
TOTAL_PREFIX = "gpupack_total_"
NODE_PREFIX = "gpupack_node_"
NODE_SLOTS = 1000


def memory_resource(node: str, index: int) -> str:
    """The custom resource that holds device ``index`` of ``node``'s memory, in MiB."""
    return f"{RESOURCE_PREFIX}{node}_{index}"


def node_resource(node: str) -> str:
    return f"{NODE_PREFIX}{node}"

"""Node-wide replicas: which shared node a fractional pod takes, and which idle node is switched.

Under the device-plugin backend a node is *fresh* (nothing placed, may become
anything), *whole* (hands out ``nvidia.com/gpu``) or *shared* with ``r``
replicas per GPU (hands out ``nvidia.com/gpu.shared`` only). The rules below are
the live controller's (``controller.sharedplan``, ``controller.planner``) and the
simulator's product model's (``sharing.simulator.product``): one implementation.

1. **Waste first.** A pod fitting ``k`` replicas (``sharing.replicas.largest_replicas``)
   may use a node split into ``r <= k``; it occupies ``1000 / r`` of a GPU, so the
   nodes with the largest ``r`` waste the least. Among those, the packing policy
   chooses (``sharing.packing.policy.decide``).
2. **Switch an idle node.** Only when no shared node has a replica for it; it is
   split into ``k`` replicas. Which idle node is the policy's choice
   (:func:`switch_for`): by default the one with the fewest GPUs (ties: the
   caller's rank), so the large nodes that multi-GPU pods need stay whole. A
   policy may know better (gpupack's: the node whose CPU can feed its replicas,
   :func:`feedable_first`).
"""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

import numpy as np

from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.model import PodSpec

FRESH: Final = 0
WHOLE: Final = -1


def shared_candidates(modes: IntArray, free_replicas: IntArray, k: int) -> BoolArray:
    """Shared nodes whose replicas hold a pod fitting ``k`` replicas, with one free."""
    ok: BoolArray = (modes > 0) & (modes <= k) & (free_replicas > 0)
    return ok


def waste_first(candidates: BoolArray, modes: IntArray) -> BoolArray:
    """The candidates with the largest replica count (the smallest replica)."""
    if not candidates.any():
        return candidates
    best = int(modes[candidates].max())
    out: BoolArray = candidates & (modes == best)
    return out


def switch_choice(candidates: BoolArray, gpu_count: IntArray, rank: IntArray) -> int | None:
    """Index of the idle node to switch (fewest GPUs, then the caller's rank), or None."""
    nodes = np.flatnonzero(candidates)
    if nodes.size == 0:
        return None
    return int(nodes[np.lexsort((rank[nodes], gpu_count[nodes]))[0]])


@runtime_checkable
class ChoosesSwitch(Protocol):
    """A policy with its own choice of the idle node to split into replicas."""

    def switch_choice(
        self, cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: int | IntArray
    ) -> int | None:
        """Index of the idle node (among ``candidates``) to split into ``replicas`` (per node) for ``pod``."""
        ...


def switch_for(
    policy: object, cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: int | IntArray
) -> int | None:
    """The idle node ``policy`` switches for ``pod``: its own choice, or the fewest-GPUs rule."""
    if isinstance(policy, ChoosesSwitch):
        return policy.switch_choice(cluster, pod, candidates, replicas)
    return switch_choice(candidates, cluster.gpu_count, cluster.tie_rank)


STRANDING_BUCKET: Final = 0.1
"""Stranded fractions closer than this count as equal, so the fewest-GPUs rule still decides among them."""


def feedable_first(
    cluster: ClusterState, candidates: BoolArray, replicas: int | IntArray, cpu_per_replica: float
) -> int | None:
    """The idle node whose CPU can feed the most of its ``replicas`` per GPU.

    A node split into ``r`` replicas per GPU offers ``r * GPUs`` replicas; typical
    shared pods need ``cpu_per_replica`` CPU milli each, so ``C / cpu`` of them can
    run there and the rest of the replicas are stranded. The least stranded fraction (in steps of
    :data:`STRANDING_BUCKET`) wins; then the fewest GPUs, then the caller's rank.
    """
    nodes = np.flatnonzero(candidates)
    if nodes.size == 0:
        return None
    per_node = np.broadcast_to(np.asarray(replicas, dtype=np.int64), cluster.gpu_count.shape)
    offered = (cluster.gpu_count[nodes] * per_node[nodes]).astype(np.float64)
    feed = cluster.cpu_free[nodes] / cpu_per_replica if cpu_per_replica > 0 else np.full(nodes.size, np.inf)
    stranded = np.maximum(0.0, offered - feed) / np.maximum(offered, 1.0)
    bucket = np.floor(stranded / STRANDING_BUCKET + 0.5).astype(np.int64)
    order = np.lexsort((cluster.tie_rank[nodes], cluster.gpu_count[nodes], bucket))
    return int(nodes[order[0]])

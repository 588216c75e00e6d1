"""Node-wide replicas: which shared node a fractional pod takes, and which idle node is switched.

Under the device-plugin backend a node is *fresh* (nothing placed, may become
anything), *whole* (hands out ``nvidia.com/gpu``) or *shared* with ``r``
replicas per GPU (hands out ``nvidia.com/gpu.shared`` only). The rules below are
the live controller's (``controller.planning.sharedplan``, ``controller.planning.planner``) and the
simulator's product model's (``sharing.simulator.product``): one implementation. The order in
which a shared pod tries them is ``sharing.packing.shared_sequence``'s, and the replica counts
(``k``, a split's size) come from ``sharing.rules.replicas``.

1. **Waste first.** A pod fitting ``k`` replicas (its own size, ``sharing.rules.replicas.most_replicas``)
   may use a node split into ``r <= k``; it occupies ``1000 / r`` of a GPU, so the
   nodes with the largest ``r`` waste the least. Among those, the packing policy
   chooses (``sharing.packing.policy.decide``).
2. **Switch an idle node.** When no shared node has a replica for it, an idle
   node is split into ``k`` replicas. A policy that
   :func:`splits_before_wasting` (gpupack's) does so already when no node split
   into exactly ``k`` has room (:func:`exact_replicas`): a replica of ``1000 / k``
   wastes less than a larger one, and the split's other replicas serve the pods
   of the same size that follow. It does so only for a *small split*
   (:func:`small_splits`: at most :data:`SPLIT_FIRST_MAX_REPLICAS` replicas on
   the node); when only large ones may be made, the pod takes the smallest
   larger replica (rule 1), and only when there is none is a large split made.
   Which idle node is the policy's choice
   (:func:`switch_for`): by default the one with the fewest GPUs (ties: the
   caller's rank), so the large nodes that multi-GPU pods need stay whole. A
   policy may know better (gpupack's: among the nodes whose CPU can feed their
   replicas, :func:`most_feedable`, the one its score prefers).
3. **Whole-GPU pods** go to whole-GPU nodes or idle ones, never to shared
   ones; where among them is the policy's choice (:func:`place_whole`): by
   default its score over all of them. A policy may know better (gpupack's:
   whole-GPU nodes already in use first, and else the idle node least able to
   feed replicas, :func:`least_feedable`, so idle nodes stay idle for sharing).
"""

from __future__ import annotations

from typing import Final, Protocol, runtime_checkable

import numpy as np

from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.specs import PodPlacement, PodSpec, Refusal
from sharing.packing.policy import Policy, decide

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


def exact_replicas(candidates: BoolArray, modes: IntArray, k: int | IntArray) -> BoolArray:
    """The candidates split into exactly ``k`` replicas (per node when an array): the replica is
    as small as the pod allows, so a split of an idle node could not waste less."""
    out: BoolArray = candidates & (modes >= k)
    return out


SPLIT_FIRST_MAX_REPLICAS: Final = 16
"""The most replicas a split may put on a node for a policy that splits before it wastes to
make it rather than give the pod a larger free replica (rule 2): 2 GPUs x 8, 4 x 4, 8 x 2.

A larger split is filled by pods of one size only, and what they leave stays free (on
openb's 8-GPU nodes the CPU runs out first): it strands more than a larger replica wastes.
Chosen on gpuspec20, seeds 42-44, among 8, 12, 16, 24 and 32 (docs/simulator.md, "Split
before wasting, only small splits")."""


def small_splits(candidates: BoolArray, gpu_count: IntArray, replicas: int | IntArray) -> BoolArray:
    """The idle ``candidates`` whose split into ``replicas`` per GPU (per node when an array)
    offers at most :data:`SPLIT_FIRST_MAX_REPLICAS` replicas."""
    out: BoolArray = candidates & (gpu_count * np.asarray(replicas, dtype=np.int64) <= SPLIT_FIRST_MAX_REPLICAS)
    return out


def splits_before_wasting(policy: object) -> bool:
    """Whether ``policy`` splits an idle node into the pod's ``k`` replicas (a small split) before
    it puts the pod in a larger replica of a node already shared (rule 2's order; gpupack's does)."""
    return bool(getattr(policy, "splits_before_wasting", False))


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
        self, cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: int | IntArray,
        small_only: bool = False,
    ) -> int | None:
        """Index of the idle node (among ``candidates``) to split into ``replicas`` (per node) for
        ``pod``; with ``small_only``, None unless the node it prefers is a small split."""
        ...


def switch_for(
    policy: object, cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: int | IntArray,
    small_only: bool = False,
) -> int | None:
    """The idle node ``policy`` switches for ``pod``: its own choice, or the fewest-GPUs rule;
    ``small_only``: a small split (:func:`small_splits`) or None (rule 2)."""
    if isinstance(policy, ChoosesSwitch):
        return policy.switch_choice(cluster, pod, candidates, replicas, small_only)
    if small_only:
        candidates = small_splits(candidates, cluster.gpu_count, replicas)
    return switch_choice(candidates, cluster.gpu_count, cluster.tie_rank)


STRANDING_BUCKET: Final = 0.1
"""Stranded fractions closer than this count as equal, so the fewest-GPUs rule still decides among them."""


def _stranded_bucket(gpus: IntArray, cpu: IntArray, replicas: IntArray, cpu_per_replica: float) -> IntArray:
    """Share of ``gpus * replicas`` replicas that ``cpu`` cannot feed, in steps of :data:`STRANDING_BUCKET`."""
    offered = (gpus * replicas).astype(np.float64)
    feed = cpu / cpu_per_replica if cpu_per_replica > 0 else np.full(gpus.shape, np.inf)
    stranded = np.maximum(0.0, offered - feed) / np.maximum(offered, 1.0)
    bucket: IntArray = np.floor(stranded / STRANDING_BUCKET + 0.5).astype(np.int64)
    return bucket


def most_feedable(
    cluster: ClusterState, candidates: BoolArray, replicas: int | IntArray, cpu_per_replica: float
) -> BoolArray:
    """The idle candidates whose CPU can feed the most of their ``replicas`` per GPU.

    A node split into ``r`` replicas per GPU offers ``r * GPUs`` replicas; typical
    shared pods need ``cpu_per_replica`` CPU milli each, so ``C / cpu`` of them can
    run there and the rest of the replicas are stranded. The nodes with the least
    stranded fraction (in steps of :data:`STRANDING_BUCKET`) and among them the
    fewest GPUs are returned; the policy chooses among them.
    """
    nodes = np.flatnonzero(candidates)
    if nodes.size == 0:
        return candidates
    per_node = np.broadcast_to(np.asarray(replicas, dtype=np.int64), cluster.gpu_count.shape)
    bucket = _stranded_bucket(cluster.gpu_count[nodes], cluster.cpu_free[nodes], per_node[nodes], cpu_per_replica)
    least = bucket == bucket.min()
    fewest = least & (cluster.gpu_count[nodes] == cluster.gpu_count[nodes][least].min())
    out: BoolArray = np.zeros_like(candidates)
    out[nodes[fewest]] = True
    return out


def least_feedable(
    cluster: ClusterState, pod: PodSpec, candidates: BoolArray, replicas: int, cpu_per_replica: float
) -> BoolArray:
    """The idle candidates that sharing would use worst once ``pod`` (a whole-GPU pod) is on them.

    The mirror of :func:`most_feedable`: a whole-GPU pod that must claim an idle
    node claims one whose GPUs left over, split into ``replicas``, its CPU left
    over could feed the fewest of (the most stranded fraction, same steps), so
    the idle nodes that can feed replicas stay idle for shared pods. The policy
    chooses among the returned nodes.
    """
    nodes = np.flatnonzero(candidates)
    if nodes.size == 0:
        return candidates
    left_gpus = np.maximum(cluster.gpu_count[nodes] - pod.gpu_count, 0)
    left_cpu = np.maximum(cluster.cpu_free[nodes] - pod.cpu_milli, 0)
    bucket = _stranded_bucket(left_gpus, left_cpu, np.full(nodes.size, replicas, dtype=np.int64), cpu_per_replica)
    out: BoolArray = np.zeros_like(candidates)
    out[nodes[bucket == bucket.max()]] = True
    return out


@runtime_checkable
class PlacesWholePods(Protocol):
    """A policy with its own rule for where whole-GPU pods go under node-wide replicas."""

    def place_whole(self, cluster: ClusterState, pod: PodSpec, in_use: BoolArray, idle: BoolArray) -> PodPlacement | Refusal:
        """Where ``pod`` goes among whole-GPU nodes already ``in_use`` and ``idle`` nodes (either may become whole)."""
        ...


def place_whole(
    policy: Policy, cluster: ClusterState, pod: PodSpec, in_use: BoolArray, idle: BoolArray
) -> PodPlacement | Refusal:
    """Where ``policy`` puts whole-GPU ``pod``: its own rule, or its score over every candidate.

    ``in_use``: whole-GPU nodes with a GPU taken; ``idle``: nodes with nothing
    placed, which could still be split into replicas. Not committed.
    """
    if isinstance(policy, PlacesWholePods):
        return policy.place_whole(cluster, pod, in_use, idle)
    return decide(cluster, pod, policy, in_use | idle)

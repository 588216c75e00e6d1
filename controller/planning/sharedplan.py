"""Placing shared (MPS / time-slicing) pods with the packing engine of ``sharing.packing``.

The live controller must place pods with the engine the simulator measures, so
shared nodes become ``sharing.packing`` nodes: a GPU split into ``r`` replicas
is a GPU of 1000 milli whose free milli is its free replicas times ``1000 // r``;
a pod asks its own compute milli (what it will really use, so the
fragmentation gradient sees the true shape of the demand). A node's GPU model
key is its product and a pod accepts the products its affinity allows, as the
simulator keys a node by its GPU type; which nodes share in the pod's mode into
replicas its request fits is a mask per pod shape. So the policy measures
fragmentation against the same typical pods, over the same GPUs, as the
simulator's product model: the GPU pods that exist (:func:`typical_pods`).

The node-wide replica rules are ``sharing.packing.node_sharing``'s, the ones
the simulator's product model replays: a pod goes to the shared nodes with the
largest replica count it fits (waste first), the policy chooses among them,
the idle node to split when none has room is the policy's choice too
(:meth:`SharedPlacer.switch`), and so is where a whole-GPU pod goes among
whole-GPU nodes in use and idle ones (:meth:`SharedPlacer.place_whole`). Ties
go to the first node by name.

Pods of different priorities are kept off each other's nodes as the product model keeps them
(``sharing.packing.priority_affinity``, one rule): with ``prefer``, :meth:`SharedPlacer.place`
takes a free replica only on a node whose GPU pods (placed, pinned, or released or split for this
cycle) all have the pod's priority, and :meth:`SharedPlacer.place_whole` looks among such whole-GPU
nodes in use and the idle ones first, then among all. With every pod at one priority every node
qualifies, and the choices are those without the preference.

The device plugin, not gpupack, picks the GPU inside the node, so the
engine's GPU choice is only used to keep the cluster state consistent.

A cycle asks the same questions of many pods of few shapes, so the answers that
depend only on a pod's shape (the splits it fits, the nodes its selector and
affinity admit) are computed once per shape and cycle, as arrays over the
shared nodes: placing a pod costs a few array operations, not a loop over nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from controller.state.snapshot import Node, PlainGpuPod, Pod
from sharing.packing.cluster import ClusterState
from sharing.packing.node_sharing import exact_replicas, place_whole, switch_for, waste_first
from sharing.packing.policy import Policy, decide
from sharing.api.gpu_pod_site import UNCOUNTED_MODES
from sharing.packing.priority_affinity import unmixed_among
from sharing.packing.registry import make_policy
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodPlacement, PodSpec
from sharing.packing.typical import NO_GPU_POD, TypicalPods

_BIG_CPU = 10**9  # nodes whose allocatable is unknown: CPU never limits the GPU choice
_NEVER = 10**6  # a replica count no node has
ANY_GPU = "gpu"
"""The engine's GPU model key of a node whose product is unknown."""


def gpu_key(node: Node) -> str:
    """The engine's GPU model key of a node: its product, as the simulator keys a node by its GPU type."""
    return node.product or ANY_GPU


def _engine_spec(key: str, cpu_milli: int, memory_mib: int, gpus: int, milli: int, products: tuple[str, ...]) -> PodSpec:
    accepted = tuple(sorted(products))
    return PodSpec(key, cpu_milli, memory_mib, gpus, milli, accepted, "|".join(accepted))


def engine_pod(pod: Pod) -> PodSpec:
    """The pod as the packing engine sees it: its CPU and memory, its GPUs (a ``whole`` pod asks
    whole GPUs), and the products its own affinity allows (empty: any)."""
    if pod.mode == "whole":
        return _engine_spec(pod.key, pod.cpu_milli, pod.memory_mib, max(1, pod.whole_gpus), GPU_MILLI, pod.products)
    milli = max(1, min(GPU_MILLI - 1, max(pod.milli, default=1)))
    return _engine_spec(pod.key, pod.cpu_milli, pod.memory_mib, 1, milli, pod.products)


def plain_gpu_pod(pod: PlainGpuPod) -> PodSpec:
    """A pod asking ``nvidia.com/gpu`` itself (not gpupack's), as the packing engine sees it."""
    return _engine_spec(pod.key, pod.cpu_milli, pod.memory_mib, max(1, pod.gpus), GPU_MILLI, pod.products)


def typical_pods(pods: Sequence[Pod], plain: Sequence[PlainGpuPod] = ()) -> TypicalPods:
    """FGD's typical pods, from the GPU pods that exist (``present``, the rule the simulator's
    product model replays): gpupack's shared and whole-GPU pods and the pods asking
    ``nvidia.com/gpu`` themselves, placed or waiting. MIG pods are not the engine's."""
    shapes = [engine_pod(p) for p in pods if p.mode != "mig"] + [plain_gpu_pod(p) for p in plain]
    return TypicalPods.from_pods(shapes or [NO_GPU_POD])


class SharedPlacer:
    """One planning cycle's engine state over the shared nodes.

    Nodes are keyed by GPU product (:func:`gpu_key`) and a pod accepts the products its affinity
    allows, as in the simulator; which shared nodes a pod's mode, replica rule and GPU memory fit
    is a mask per pod shape (:meth:`fits_split`), so the policy measures fragmentation against the
    same typical pods over the same GPUs as the product model does."""

    def __init__(self, nodes: Sequence[Node], free: dict[str, int], workload: Sequence[Pod], policy_name: str = "gpupack",
                 room: Mapping[str, tuple[int, int]] | None = None, plain: Sequence[PlainGpuPod] = ()) -> None:
        """``room``: node -> CPU milli and memory MiB its pods leave (``FreeCapacity.room``, read
        live, so pods released elsewhere this cycle count); without it, the nodes' own.
        ``workload`` and ``plain``: the GPU pods that exist (:func:`typical_pods`)."""
        self.room: Mapping[str, tuple[int, int]] = room if room is not None else {
            n.name: n.room for n in nodes if n.room is not None}
        self.nodes = tuple(n for n in nodes if n.sharing != "none" and n.full_gpus and n.name in free)
        self._names = [n.name for n in self.nodes]
        self._replicas = np.array([n.replicas for n in self.nodes], dtype=np.int64)
        self._kinds = [(n.sharing, n.replicas, max((g.memory_mib for g in n.full_gpus), default=0)) for n in self.nodes]
        self._fits: dict[tuple[object, ...], np.ndarray[Any, np.dtype[np.bool_]]] = {}
        self._admitted: dict[tuple[object, ...], np.ndarray[Any, np.dtype[np.bool_]]] = {}
        self.cluster: ClusterState | None = None
        # The GPU pods per node and priority, for the placement preference (priority_affinity):
        # node ids in order of first sight, one (node id, priority) pair per pod.
        self._node_ids: dict[str, int] = {}
        self._on: list[int] = []
        self._priorities: list[int] = []
        for p in workload:
            if p.node is not None and p.mode not in UNCOUNTED_MODES:  # no replica or whole GPU: MIG, or no GPU
                self.record(p.node, p.priority.value)
        for q in plain:  # kube-scheduler's GPU pods count as the model counts every GPU pod
            if q.node is not None:
                self.record(q.node, q.priority)
        self.policy: Policy = make_policy(policy_name, rng=np.random.default_rng(0), typical=typical_pods(workload, plain))
        if not self.nodes:
            return
        specs = [_spec(n, gpu_key(n), self.room) for n in self.nodes]
        self.cluster = ClusterState(specs)
        for i, n in enumerate(self.nodes):
            share = GPU_MILLI // n.replicas
            taken = len(n.full_gpus) * n.replicas - free[n.name]
            # Which GPU a replica is on is the device plugin's business; fill in order.
            for g in range(len(n.full_gpus)):
                on_gpu = min(taken, n.replicas)
                taken -= on_gpu
                if on_gpu:
                    milli = GPU_MILLI if on_gpu == n.replicas else on_gpu * share
                    self.cluster.place(PodSpec(f"claimed/{n.name}/{g}", 0, 0, 1, milli), i, (g,))

    def record(self, node: str, priority: int) -> None:
        """A GPU pod of ``priority`` is on ``node`` from now on, for the placement preference (placed,
        or released or split for this cycle)."""
        self._on.append(self._node_ids.setdefault(node, len(self._node_ids)))
        self._priorities.append(priority)

    def mixes(self, pod: Pod) -> bool:
        """Whether any GPU pod counted has another priority than ``pod``: else the preference changes nothing."""
        return any(p != pod.priority.value for p in self._priorities)

    def unmixed(self, pod: Pod, names: Sequence[str]) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Per node of ``names``, whether every GPU pod on it has ``pod``'s priority (``priority_affinity``)."""
        ok = unmixed_among(np.array(self._on, dtype=np.int64), np.array(self._priorities, dtype=np.int64),
                           len(self._node_ids), pod.priority.value)
        ids = self._node_ids
        return np.array([name not in ids or bool(ok[ids[name]]) for name in names], dtype=bool)

    def fits_split(self, pod: Pod) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which shared nodes share in the pod's mode into replicas its request fits (``sharing.rules.replicas``)."""
        shape = (pod.mode, pod.milli, pod.memory_bytes)
        found = self._fits.get(shape)
        if found is None:
            found = self._fits[shape] = np.array(
                [mode == pod.mode and pod.fits_replicas(replicas, memory) for mode, replicas, memory in self._kinds],
                dtype=bool)
        return found

    def _admits(self, pod: Pod) -> np.ndarray[Any, np.dtype[np.bool_]]:
        """Which shared nodes the pod's nodeSelector and required affinity admit (by its terms)."""
        shape = (pod.node_selector, pod.terms)
        found = self._admitted.get(shape)
        if found is None:
            found = self._admitted[shape] = np.array([pod.admits(n.label_map) for n in self.nodes], dtype=bool)
        return found

    def place(self, pod: Pod, free: dict[str, int], own_size: dict[str, int] | None = None,
              prefer: bool = False) -> str | None:
        """The node the engine picks for ``pod`` among nodes with free replicas; commits it.

        ``own_size``: only nodes split into the replica count given per node name (the
        pod's own size; ``node_sharing.exact_replicas``); without it, waste first.
        ``prefer``: only nodes whose GPU pods all have the pod's priority (:meth:`unmixed`)."""
        if self.cluster is None:
            return None
        spec = engine_pod(pod)
        # Nodes without enough free replicas (or other than the one a half-released pod
        # is pinned to) are masked out; the state itself stays true for the policy's cache.
        room = np.fromiter((free.get(name, 0) for name in self._names), dtype=np.int64, count=len(self._names))
        allowed = (room >= pod.shares) & self._admits(pod) & self.fits_split(pod)
        if pod.node is not None:
            allowed &= np.array([name == pod.node for name in self._names], dtype=bool)
        if prefer and allowed.any():
            allowed &= self.unmixed(pod, self._names)
        if not allowed.any():
            return None
        replicas = self._replicas
        candidates = allowed & self.cluster.feasible(spec)
        if own_size is None:
            nearest = waste_first(candidates, replicas)
        else:
            # A node missing from own_size (or with 0: the pod fits no split of it) is never exact.
            sizes = np.fromiter((own_size.get(name, 0) or _NEVER for name in self._names), dtype=np.int64,
                                count=len(self._names))
            nearest = exact_replicas(candidates, replicas, sizes)
        outcome = decide(self.cluster, spec, self.policy, nearest)
        if not isinstance(outcome, PodPlacement):
            return None
        node = self.nodes[outcome.node]
        share = GPU_MILLI // node.replicas
        gpu = outcome.gpus[0]
        # Commit what the device plugin takes (whole replicas), not the pod's own milli.
        taken = min(int(self.cluster.gpu_free[outcome.node, gpu]), share * pod.shares)
        self.cluster.place(PodSpec(spec.name, spec.cpu_milli, spec.memory_mib, 1, max(1, taken)), outcome.node, (gpu,))
        self.record(node.name, pod.priority.value)
        return node.name

    def place_whole(self, pod: Pod, nodes: Sequence[Node], free: dict[str, int]) -> str | None:
        """The node the engine picks for a ``whole`` pod among ``nodes`` (free whole GPUs in ``free``):
        among the idle ones and the nodes in use whose GPU pods all have its priority first, then
        among all (the product model's order, ``priority_affinity``)."""
        candidates = [n for n in sorted(nodes, key=lambda n: n.name) if free.get(n.name, 0) >= pod.whole_gpus]
        if not candidates:
            return None
        cluster = ClusterState([_spec(n, gpu_key(n), self.room) for n in candidates])
        for i, n in enumerate(candidates):
            used = len(n.full_gpus) - free[n.name]
            for g in range(min(used, len(n.full_gpus))):
                cluster.place(PodSpec(f"taken/{n.name}/{g}", 0, 0, 1, GPU_MILLI), i, (g,))
        # A node with every GPU free is idle (it could still be split into replicas),
        # the simulator's "fresh"; one with a GPU taken is a whole-GPU node in use.
        idle = np.array([free[n.name] >= len(n.full_gpus) for n in candidates], dtype=bool)
        outcome = None
        if self.mixes(pod):
            unmixed = self.unmixed(pod, [n.name for n in candidates])
            outcome = place_whole(self.policy, cluster, engine_pod(pod), ~idle & unmixed, idle)
        if not isinstance(outcome, PodPlacement):
            outcome = place_whole(self.policy, cluster, engine_pod(pod), ~idle, idle)
        if not isinstance(outcome, PodPlacement):
            return None
        chosen = candidates[outcome.node].name
        self.record(chosen, pod.priority.value)
        return chosen

    def switch(self, pod: Pod, idle: Sequence[tuple[Node, int]], small_only: bool = False) -> tuple[Node, int] | None:
        """Which idle node to split for ``pod``, each candidate with the replica count it would get;
        ``small_only``: a small split or None (``node_sharing.switch_for``)."""
        if not idle:
            return None
        ordered = sorted(idle, key=lambda c: c[0].name)
        cluster = ClusterState([_spec(n, gpu_key(n), self.room) for n, _ in ordered])
        replicas = np.array([r for _, r in ordered], dtype=np.int64)
        chosen = switch_for(self.policy, cluster, engine_pod(pod), cluster.feasible(engine_pod(pod)), replicas, small_only)
        return None if chosen is None else ordered[chosen]


def _spec(node: Node, key: str, room: Mapping[str, tuple[int, int]]) -> NodeSpec:
    """The engine's node: its GPUs, and the CPU and memory its pods leave (``room``; a node
    whose allocatable is unknown never limits the choice)."""
    cpu, memory = room.get(node.name, (_BIG_CPU, _BIG_CPU))
    return NodeSpec(node.name, max(0, cpu), max(0, memory), len(node.full_gpus), key)

"""The engine's victim choice (``sharing.packing.preemption.engine_preemption``) on the live device-plugin pool.

The simulator and the controller choose victims with one function. This module builds the
engine's state from the cycle's snapshot for one preemptor and maps the engine's plan back to
the controller's :class:`~controller.planning.preemption.Preemption`:

* the nodes a preemptor could take as they are: for a single-container shared pod, the nodes
  that share by its mode into a replica count its request fits (``modes`` = that count); for a
  whole-GPU pod, the unshared nodes (``modes`` = ``WHOLE``), and the shared nodes the caller may
  switch back to whole GPUs now (``reclaim``: the policy gate is open) whose every replica is
  held by a gpupack pod (``modes`` = their replica count): there the engine's plan is a
  *reshape* (every GPU pod preempted, all of lower priority; reason ``reshape``), which the
  planner carries out by holding the node for the preemptor and switching it back once the
  victims are gone. Likewise for a one-replica pod: the unshared nodes whose whole GPUs all
  hold gpupack pods, and the nodes sharing by its mode into more replicas than it fits, which
  the planner then splits at the pod's own size. The engine never plans an idle split here;
* per node the CPU and memory its pods request (the ledger's room), and per GPU the replicas
  taken (the node's claimed replicas, GPU by GPU in order: the device plugin, not gpupack, picks
  the GPU inside a node) or the whole GPUs taken;
* as :class:`~sharing.packing.victims.PlacedPods`, gpupack's pods bound or pinned there (never
  the DRA pool's, never pods that are not gpupack's), each with its priority, milli, CPU and
  memory; those already chosen this cycle are left out.

MIG pods and shared pods of several containers are not the engine's case (its preemption
models node-wide replicas and whole GPUs, one replica per pod): the caller keeps its own
ranking for them (:mod:`controller.planning.preemption`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from controller.planning.capacity import FreeCapacity
from controller.state.snapshot import Node, Pod
from sharing.packing.cluster import ClusterState
from sharing.packing.node_sharing import WHOLE
from sharing.packing.preemption import PreemptionPlan, engine_preemption
from sharing.packing.specs import GPU_MILLI, NodeSpec, PodSpec
from sharing.packing.victims import PlacedPods, Victim
from sharing.rules.replicas import fits_split, most_replicas

_BIG = 10**9
"""CPU and memory of a node whose allocatable is unknown: they never limit."""


def engine_case(pod: Pod) -> bool:
    """Whether the engine's preemption models ``pod``: one replica, or whole GPUs."""
    return pod.mode == "whole" or (pod.shares == 1 and pod.mode in ("mps", "time-slicing"))


def _usable(pod: Pod, node: Node) -> bool:
    if not node.full_gpus or any(g.mig_enabled for g in node.gpus) or not node.converged:
        return False
    if pod.mode == "whole":
        return node.sharing == "none" and node.spec_sharing == "none"
    return node.sharing == pod.mode and fits_split(node.replicas, pod.asks, node.gpu_memory_bytes)


def _reclaimable(pod: Pod, node: Node, free: FreeCapacity, pods: Sequence[Pod], spared: set[str]) -> bool:
    """A node the engine may reshape for ``pod`` (preempt every GPU pod there, then switch it to what the
    pod needs): for a whole-GPU pod a shared node; for a one-replica pod an unshared node, or one
    sharing by its mode into more replicas than it fits. Settled, no MIG, no fault, and every replica
    or whole GPU taken is held by a gpupack pod listed here and not chosen this cycle (a replica
    released to it this cycle, a pod that is not gpupack's, or a pod another preemptor takes, would be
    left on a node switched under it)."""
    if node.spec_sharing != node.sharing or node.spec_replicas != node.replicas or not node.converged \
            or node.faulted or not node.full_gpus or any(g.mig_enabled for g in node.gpus):
        return False
    if pod.mode == "whole":
        kind_ok = node.sharing != "none"
    else:
        kind_ok = node.sharing == "none" or (node.sharing == pod.mode
                                             and not fits_split(node.replicas, pod.asks, node.gpu_memory_bytes))
    if not kind_ok:
        return False
    holders = [p for p in pods if p.node == node.name and not p.gated and p.backend != "dra" and (p.shares or p.whole_gpus)]
    if not holders or any(p.key in spared for p in holders):
        return False
    if node.sharing == "none":
        return free.whole[node.name] + sum(p.whole_gpus for p in holders) == len(node.full_gpus)
    return free.shared[node.name] + sum(p.shares for p in holders) == len(node.full_gpus) * node.replicas


def engine_plan(pod: Pod, nodes: Sequence[Node], free: FreeCapacity, pods: Sequence[Pod], *,
                admits: Callable[[Node], bool], spared: set[str],
                reclaim: Callable[[Node], bool] | None = None) -> tuple[Node, PreemptionPlan] | None:
    """The engine's plan for ``pod`` over the nodes it could take as they are, and the node; None when
    the engine finds none (or the pod is not its case).

    ``reclaim``: the nodes whose switch to what the pod needs (whole GPUs, or its mode at its own
    size) the policy gate allows now (the caller's judgement, with the labels the switch gives the
    node); those of them :func:`_reclaimable` are offered to the engine too, as it models them: nodes
    it may *reshape* (preempt every GPU pod, all of lower priority, and switch the node)."""
    if not engine_case(pod):
        return None
    reclaimable = {n.name for n in nodes if reclaim is not None and not _usable(pod, n)
                   and _reclaimable(pod, n, free, pods, spared) and reclaim(n)}
    pool = [n for n in nodes if n.name in reclaimable or _usable(pod, n) and admits(n)]
    if not pool:
        return None
    cluster = ClusterState([NodeSpec(n.name, n.cpu_milli or _BIG, n.memory_mib or _BIG, len(n.full_gpus),
                                     n.product or "gpu") for n in pool])
    width = max(len(n.full_gpus) for n in pool)
    modes = np.array([n.replicas if n.sharing != "none" else WHOLE for n in pool], dtype=np.int64)
    used = np.zeros((len(pool), width), dtype=np.int64)
    placed = PlacedPods(len(pool))
    index = {n.name: i for i, n in enumerate(pool)}
    holders: dict[int, list[Pod]] = {}
    for other in pods:
        i = index.get(other.node or "")
        if i is not None and not other.gated and other.backend != "dra" and (other.shares or other.whole_gpus):
            holders.setdefault(i, []).append(other)
    for i, node in enumerate(pool):
        room = free.room.get(node.name)
        if room is not None:  # what the node's pods request, less the holders placed below
            held_cpu = sum(p.cpu_milli for p in holders.get(i, ()))
            held_mem = sum(p.memory_mib for p in holders.get(i, ()))
            cpu = max(0, node.cpu_milli - room[0] - held_cpu)
            mem = max(0, node.memory_mib - room[1] - held_mem)
            if cpu or mem:
                cluster.place(PodSpec(f"used/{node.name}", min(cpu, int(cluster.cpu_free[i])),
                                      min(mem, int(cluster.mem_free[i]))), i, ())
        _place_holders(cluster, modes, used, placed, i, node, free, holders.get(i, []), spared)
    shape = PodSpec(pod.key, pod.cpu_milli, pod.memory_mib, 1 if pod.shares else pod.whole_gpus,
                    min(GPU_MILLI, max(pod.milli, default=0)) if pod.shares else GPU_MILLI)
    own = max(int(modes.max()), 1)
    if pod.shares:
        # Its own size, as the model gives the engine (``sharing.simulator.preempting``): a node split
        # finer is one to reshape, not one whose replica it takes.
        own = most_replicas(pod.asks, max(n.gpu_memory_bytes for n in pool)) if reclaimable else \
            max(own, most_replicas(pod.asks, max(n.gpu_memory_bytes for n in pool), 1, own))
    plan = engine_preemption(cluster, modes, used, placed, shape, pod.priority, own_size=own)
    if plan is None or not plan.victims or (plan.reshape != (pool[plan.node].name in reclaimable)):
        # Live, a reshape is carried out only on a node offered for it (module docstring), and a node is
        # never split anew otherwise. A plan without victims would say the pod fits, which the planner
        # has just found it does not.
        return None
    return pool[plan.node], plan


def _place_holders(cluster: ClusterState, modes: np.ndarray, used: np.ndarray, placed: PlacedPods, i: int,
                   node: Node, free: FreeCapacity, holders: list[Pod], spared: set[str]) -> None:
    """The node's GPU pods into the engine's state, GPU by GPU in order; those not already chosen
    this cycle as possible victims."""
    gpus = len(node.full_gpus)
    if modes[i] > 0:
        r = int(modes[i])
        taken = max(0, gpus * r - free.shared[node.name])
        for holder in sorted(holders, key=lambda p: p.key):
            gpu = next((j for j in range(gpus) if used[i, j] < r), None)
            if gpu is None or taken <= 0:
                break
            used[i, gpu] += 1
            taken -= 1
            spec = PodSpec(holder.key, min(holder.cpu_milli, int(cluster.cpu_free[i])),
                           min(holder.memory_mib, int(cluster.mem_free[i])), 1, GPU_MILLI // r)
            placement = cluster.place(spec, i, (gpu,))
            if holder.key not in spared:
                placed.add(Victim(holder.key, holder.priority.value, sum(holder.milli), placement, replica=True,
                                  started=holder.created.timestamp()))
        # Replicas taken by no pod listed here (released to this node earlier in the cycle): taken, never victims.
        for j in range(gpus):
            while taken > 0 and used[i, j] < r:
                used[i, j] += 1
                taken -= 1
                cluster.place(PodSpec(f"taken/{node.name}/{j}/{int(used[i, j])}", 0, 0, 1, GPU_MILLI // r), i, (j,))
        return
    whole_free = free.whole[node.name]
    next_gpu = 0
    for holder in sorted(holders, key=lambda p: p.key):
        q = holder.whole_gpus
        if q <= 0 or next_gpu + q > gpus:
            continue
        spec = PodSpec(holder.key, min(holder.cpu_milli, int(cluster.cpu_free[i])),
                       min(holder.memory_mib, int(cluster.mem_free[i])), q, GPU_MILLI)
        placement = cluster.place(spec, i, tuple(range(next_gpu, next_gpu + q)))
        next_gpu += q
        if holder.key not in spared:
            placed.add(Victim(holder.key, holder.priority.value, GPU_MILLI * q, placement,
                              started=holder.created.timestamp()))
    # GPUs taken by pods that are not gpupack's (or pinned ones not listed): not free, never victims.
    others = max(0, gpus - next_gpu - whole_free)
    if others:
        cluster.place(PodSpec(f"others/{node.name}", 0, 0, others, GPU_MILLI), i,
                      tuple(range(next_gpu, next_gpu + others)))


__all__ = ["engine_case", "engine_plan"]

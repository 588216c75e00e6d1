"""Which placed pods a pod that fits nowhere preempts: the engine's choice and kube-scheduler's default.

Both are pure functions of the engine's state under node-wide replicas: the
:class:`~sharing.packing.cluster.ClusterState`, the node modes and replicas taken
(``modes``: :data:`~sharing.packing.node_sharing.FRESH`, :data:`~sharing.packing.node_sharing.WHOLE`
or the node's replica count ``r``; ``used``: replicas taken per GPU, as
``sharing.simulator.product`` keeps them) and the placed pods
(:class:`~sharing.packing.victims.PlacedPods`). They change nothing; the caller removes the
plan's victims and places the preemptor. Signature of both::

    engine_preemption(cluster, modes, used, placed, pod, priority, own_size=0, fragmentation=None)
    scheduler_preemption(cluster, modes, used, placed, pod, priority, own_size=0,
                         offset=0, max_candidates=None)
        -> PreemptionPlan | None

``pod`` is the request as the engine places it (a fractional pod above half a GPU already
rewritten to a whole GPU); ``own_size`` is a fractional pod's replica count
(``sharing.rules.replicas.most_replicas``): it fits a replica of a node split into ``r <= own_size``.
Only pods that :func:`sharing.rules.priority.may_preempt` allows are victims (strictly lower
priority; none for a ``Never`` preemptor, which gets None).

**What frees a place** (one additive rule for both): on a node the preemptor needs CPU,
memory and a GPU share. A shared node split into ``r <= own_size`` needs one free replica
(each preempted replica pod frees one); a whole-GPU or idle node needs ``q`` wholly free GPUs
(each preempted whole-GPU pod frees its GPUs); an idle node for a fractional pod needs only
CPU and memory (it is then split); a pod that asks for no GPU needs only CPU and memory.

**The engine** (:func:`engine_preemption`, issue 36) may also *reshape*: preempt every GPU pod of
a node so that it can be split anew (into ``own_size`` for a fractional pod) or switched to
whole GPUs, since a node's replica count is node-wide. Per node it covers what is missing
greedily (the pod that covers most of what is still missing first; among equals, lowest
priority, then least milli), then reprieves the victims it does not need (highest priority
and most milli first). Among nodes it takes the plan with the fewest victims, then the lowest
highest victim priority, then the least milli preempted, then one that the preemptor fills
exactly (its own replica size or whole GPUs, and the victims freed no more GPU than it
takes), then the least fragmentation after the plan (FGD's ``F`` against the engine's typical
pods, ``fragmentation``; without one, the least free GPU milli left on the node), then the
cluster's ``tie_rank``. (The orders are :mod:`sharing.packing.victim_order`'s, which the live
controller ranks by too.) When some node needs a single victim, the nodes are narrowed in numpy
to those with the best single victim before the per-node search (a replay asks this for
thousands of pods on 1,213 nodes).

**kube-scheduler's default** (:func:`scheduler_preemption`, the DefaultPreemption plugin; facts
from ``pkg/scheduler/framework/preemption/preemption.go`` and
``pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go``, Kubernetes v1.3x):

- per node (``SelectVictimsOnNode``): remove every pod of lower priority; if the preemptor does
  not fit even then, the node is no candidate; else reprieve pods, most important first
  (higher priority, then earlier start), the ones whose eviction would violate a
  PodDisruptionBudget before the others, keeping each reprieved pod while the preemptor still
  fits;
- it dry-runs nodes from a random ``offset`` in the node list and stops at
  ``max(10 % of the nodes, 100)`` candidates (``GetOffsetAndNumCandidates``); ``max_candidates``
  None here examines every node, the caller passes kube's number to model it;
- it picks a node (``pickOneNodeForPreemption``) by the fewest PDB violations, then the lowest
  highest victim priority, then the smallest sum of victim priorities, then the fewest victims,
  then the latest start among the highest-priority victims, then the first in its order;
- it never reshapes: a node keeps its mode (replica count or whole GPUs), and a node that is
  not of the pod's kind (a shared node for a whole-GPU pod, an idle node for a fractional
  one, which advertises no replicas) is never a candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

from sharing.api.priority import INT32_MIN, PodPriority
from sharing.packing.cluster import BoolArray, ClusterState, IntArray
from sharing.packing.fragmentation import FragmentationModel
from sharing.packing.node_sharing import FRESH
from sharing.packing.specs import GPU_MILLI, PodSpec
from sharing.packing.victim_order import plan_key, reprieve_key, victim_key
from sharing.packing.victims import PlacedPods, Victim
from sharing.rules.priority import may_preempt

REASON_REPLICA: Final = "replica"
"""A replica of a shared node freed for a fractional pod (or CPU/memory beside a free one)."""
REASON_GPUS: Final = "whole-gpus"
"""Whole GPUs (or CPU/memory beside them) freed on a whole-GPU or idle node."""
REASON_IDLE: Final = "idle-node"
"""CPU/memory freed on an idle node, which is then split for the fractional preemptor."""
REASON_RESHAPE: Final = "reshape"
"""Every GPU pod of a node preempted so that it is split anew or switched to whole GPUs (engine only)."""
REASON_CPU: Final = "cpu-memory"
"""CPU/memory freed for a pod that asks for no GPU."""
REASON_SCHEDULER: Final = "scheduler-default"
"""kube-scheduler's default preemption chose the victims."""
REASONS: Final = (REASON_REPLICA, REASON_GPUS, REASON_IDLE, REASON_RESHAPE, REASON_CPU, REASON_SCHEDULER)

MIN_CANDIDATES_PERCENT: Final = 10
"""kube-scheduler's ``MinCandidateNodesPercentage`` default."""
MIN_CANDIDATES_ABSOLUTE: Final = 100
"""kube-scheduler's ``MinCandidateNodesAbsolute`` default."""


@dataclass(frozen=True)
class PreemptionPlan:
    """Where a preemptor goes once ``victims`` are gone."""

    node: int
    gpus: tuple[int, ...]
    """The GPUs of ``node`` it takes (one for a fractional pod; none for a pod without GPU)."""
    victims: tuple[Victim, ...]
    reshape: bool
    """The node's mode changes for it: every GPU pod is preempted and the node is split anew
    (into ``replicas``) or switched to whole GPUs."""
    reason: str
    """One of :data:`REASONS` (a metric's label value)."""
    replicas: int | None = None
    """The replica count ``node`` is split into for the preemptor (an idle or reshaped node); None: as it is."""
    exact: bool = False
    """The preemptor fills what the victims free exactly (its own replica size or whole GPUs, nothing left over)."""

    @property
    def preempted_milli(self) -> int:
        return sum(v.milli for v in self.victims)


def candidate_count(nodes: int) -> int:
    """How many candidate nodes kube-scheduler's dry run collects (``GetOffsetAndNumCandidates``)."""
    return min(nodes, max(nodes * MIN_CANDIDATES_PERCENT // 100, MIN_CANDIDATES_ABSOLUTE))


# ---------------------------------------------------------------------------------- what a node needs
_CPU, _REPLICA, _GPUS, _IDLE, _RESHAPE, _NONE = range(6)
_KIND_REASON = {_CPU: REASON_CPU, _REPLICA: REASON_REPLICA, _GPUS: REASON_GPUS, _IDLE: REASON_IDLE,
                _RESHAPE: REASON_RESHAPE}


def _kinds(cluster: ClusterState, modes: IntArray, pod: PodSpec, own_size: int, reshape: bool) -> IntArray:
    """Per node, how the preemptor could take it (module docstring); ``_NONE`` where it cannot."""
    n = len(cluster)
    if pod.gpu_count == 0:
        return np.full(n, _CPU, dtype=np.int64)
    able = cluster.model_mask(pod.gpu_models) & (cluster.gpu_count >= pod.gpu_count)
    if pod.is_shared:
        if own_size < 1:
            raise ValueError(f"pod {pod.name!r} is fractional: give its own replica size (own_size >= 1)")
        kind = np.where((modes > 0) & (modes <= own_size), _REPLICA,
                        np.where(modes == FRESH, _IDLE if reshape else _NONE, _RESHAPE if reshape else _NONE))
    else:
        kind = np.where(modes <= FRESH, _GPUS, _RESHAPE if reshape else _NONE)
    out: IntArray = np.where(able, kind, _NONE).astype(np.int64)
    return out


def _free_replicas(cluster: ClusterState, modes: IntArray, used: IntArray) -> IntArray:
    per_gpu = np.where(cluster.gpu_present, modes[:, None] - used, 0)
    out: IntArray = np.where(modes > 0, per_gpu.sum(axis=1), 0)
    return out


@dataclass
class _Node:
    """One node's case: what the preemptor still lacks there, and the pods that could give it."""

    node: int
    kind: int
    need_gpu: int
    need_cpu: int
    need_mem: int
    mandatory: list[Victim]
    optional: list[Victim]

    def gives(self, v: Victim) -> tuple[int, int, int]:
        gpu = (1 if v.replica else 0) if self.kind == _REPLICA else v.whole_gpus if self.kind == _GPUS else 0
        return gpu, v.placement.pod.cpu_milli, v.placement.pod.memory_mib

    def fits(self, chosen: Sequence[Victim]) -> bool:
        """Whether preempting ``chosen`` gives what is missing (the mandatory victims' share is already
        counted in the needs, so they are skipped here)."""
        gpu = cpu = mem = 0
        mandatory = {v.key for v in self.mandatory}
        for v in chosen:
            if v.key in mandatory:
                continue
            g, c, m = self.gives(v)
            gpu, cpu, mem = gpu + g, cpu + c, mem + m
        return gpu >= self.need_gpu and cpu >= self.need_cpu and mem >= self.need_mem

    def reprieve(self, chosen: Sequence[Victim], order: Sequence[Victim]) -> list[Victim]:
        """``chosen`` less each pod of ``order`` in turn that the preemptor can do without."""
        kept = list(chosen)
        for v in order:
            without = [w for w in kept if w is not v]
            if self.fits(without):
                kept = without
        return kept


def _node_case(cluster: ClusterState, modes: IntArray, used: IntArray, placed: PlacedPods, pod: PodSpec,
               priority: PodPriority, node: int, kind: int) -> _Node | None:
    """What ``pod`` lacks on ``node`` before any victim (the mandatory ones of a reshape counted)."""
    lower = [v for v in placed.on_node(node) if may_preempt(priority, v.priority)]
    mandatory: list[Victim] = []
    need_gpu = 0
    if kind == _RESHAPE:
        gpu_pods = [v for v in placed.on_node(node) if v.placement.pod.gpu_count]
        if any(not may_preempt(priority, v.priority) for v in gpu_pods):
            return None
        mandatory = gpu_pods
    elif kind == _REPLICA:
        r = int(modes[node])
        free = int(np.where(cluster.gpu_present[node], r - used[node], 0).sum())
        need_gpu = 0 if free > 0 else 1
    elif kind == _GPUS:
        need_gpu = max(0, pod.gpu_count - int(cluster.full_count[node]))
    freed_cpu = sum(v.placement.pod.cpu_milli for v in mandatory)
    freed_mem = sum(v.placement.pod.memory_mib for v in mandatory)
    return _Node(node, kind, need_gpu,
                 max(0, pod.cpu_milli - int(cluster.cpu_free[node]) - freed_cpu),
                 max(0, pod.memory_mib - int(cluster.mem_free[node]) - freed_mem),
                 mandatory, [v for v in lower if v not in mandatory])


def _cover(case: _Node) -> list[Victim] | None:
    """The engine's victims on one node: greedy cover of what is missing, then reprieve (module docstring)."""
    chosen = list(case.mandatory)
    need = [case.need_gpu, case.need_cpu, case.need_mem]
    left = list(case.optional)
    while any(x > 0 for x in need):
        best: tuple[float, int, int, str] | None = None
        pick = -1
        for i, v in enumerate(left):
            gives = case.gives(v)
            score = sum(min(g, x) / x for g, x in zip(gives, need) if x > 0)
            if score <= 0:
                continue
            rank = (-score, *victim_key(v.priority, v.milli, v.key))
            if best is None or rank < best:
                best, pick = rank, i
        if best is None:
            return None
        v = left.pop(pick)
        chosen.append(v)
        need = [x - g for x, g in zip(need, case.gives(v))]
    return case.reprieve(chosen, sorted(chosen[len(case.mandatory):],
                                        key=lambda v: reprieve_key(v.priority, v.milli, v.key)))


def _plan_for(cluster: ClusterState, modes: IntArray, used: IntArray, case: _Node, pod: PodSpec,
              victims: Sequence[Victim], own_size: int, reason: str | None = None) -> PreemptionPlan:
    """The plan on ``case.node`` with ``victims``: which GPUs the preemptor takes and whether it fills exactly."""
    node = case.node
    present = np.flatnonzero(cluster.gpu_present[node])
    freed_gpu = sum(v.placement.pod.gpu_total_milli for v in victims)
    replicas: int | None = None
    if case.kind == _CPU:
        gpus: tuple[int, ...] = ()
        exact = True
    elif case.kind == _REPLICA:
        r = int(modes[node])
        freed_on = [v.placement.gpus[0] for v in victims if v.replica]
        open_gpus = [int(g) for g in present if used[node, g] < r]
        gpus = (freed_on[0],) if freed_on else (open_gpus[0],)
        exact = r == own_size and len(freed_on) <= 1
    elif case.kind == _GPUS:
        freed = {g for v in victims for g in v.placement.gpus}
        free = [int(g) for g in present if cluster.gpu_free[node, g] == GPU_MILLI and g not in freed]
        gpus = tuple(sorted(freed)[: pod.gpu_count] + free)[: pod.gpu_count]
        exact = sum(v.whole_gpus for v in victims) <= pod.gpu_count
    else:  # an idle node, or one emptied of its GPU pods: split anew or switched
        replicas = own_size if pod.is_shared else None
        gpus = tuple(int(g) for g in present[: pod.gpu_count])
        # A replica's share in the state is 1000 // r or one milli more (the GPU's rounding).
        exact = freed_gpu <= (-(-GPU_MILLI // own_size) if pod.is_shared else pod.gpu_total_milli)
    return PreemptionPlan(node, gpus, tuple(victims), case.kind == _RESHAPE and modes[node] != FRESH,
                          reason or _KIND_REASON[case.kind], replicas, exact)


def _upper_bound(cluster: ClusterState, modes: IntArray, used: IntArray, placed: PlacedPods, pod: PodSpec,
                 priority: PodPriority, kinds: IntArray) -> BoolArray:
    """Nodes where the preemptor fits once every pod below it there is gone (kube-scheduler's first test)."""
    lower = placed.below(priority.value)
    cpu = cluster.cpu_free + placed.per_node(lower, placed.cpu)
    mem = cluster.mem_free + placed.per_node(lower, placed.mem)
    ok: BoolArray = (kinds != _NONE) & (cpu >= pod.cpu_milli) & (mem >= pod.memory_mib)
    if pod.gpu_count == 0:
        return ok
    gpu_rows = placed.alive & placed.gpu_pod
    replicas = _free_replicas(cluster, modes, used) + placed.per_node(lower & placed.replica, np.ones_like(placed.node))
    gpus = cluster.full_count + placed.per_node(lower, placed.gpus)
    all_lower = placed.per_node(gpu_rows, np.ones_like(placed.node)) == placed.per_node(lower & gpu_rows,
                                                                                       np.ones_like(placed.node))
    gpu_ok = np.select([kinds == _REPLICA, kinds == _GPUS, kinds == _RESHAPE],
                       [replicas > 0, gpus >= pod.gpu_count, all_lower], default=True)
    out: BoolArray = ok & gpu_ok
    return out


def _single_victim_nodes(cluster: ClusterState, modes: IntArray, used: IntArray, placed: PlacedPods,
                         pod: PodSpec, priority: PodPriority, kinds: IntArray) -> IntArray:
    """Nodes where one victim of the lowest (priority, milli) any single victim has is enough; empty if none."""
    rows: IntArray = np.flatnonzero(placed.below(priority.value))
    if rows.size == 0:
        return rows
    node = placed.node[rows]
    kind = kinds[node]
    ok = (kind != _NONE) & (cluster.cpu_free[node] + placed.cpu[rows] >= pod.cpu_milli)
    ok &= cluster.mem_free[node] + placed.mem[rows] >= pod.memory_mib
    if pod.gpu_count:
        free = _free_replicas(cluster, modes, used)[node]
        gpu_rows = placed.alive & placed.gpu_pod
        gpu_pods = placed.per_node(gpu_rows, np.ones_like(placed.node))[node]
        ok &= np.select([kind == _REPLICA, kind == _GPUS, kind == _RESHAPE],
                        [(free > 0) | placed.replica[rows], cluster.full_count[node] + placed.gpus[rows] >= pod.gpu_count,
                         gpu_pods - placed.gpu_pod[rows] == 0], default=True)
    rows, node = rows[ok], node[ok]
    if rows.size == 0:
        empty: IntArray = rows
        return empty
    milli = placed.milli[rows]
    prio = placed.priority[rows]
    best = (prio == prio.min())
    best &= milli == milli[best].min()
    out: IntArray = np.unique(node[best])
    return out


def _fragmentation_after(cluster: ClusterState, modes: IntArray, used: IntArray, plan: PreemptionPlan, pod: PodSpec,
                         fragmentation: FragmentationModel | None) -> float:
    """FGD's ``F`` of the plan's node once it is carried out (or its free GPU milli, without a model)."""
    node = plan.node
    free = cluster.gpu_free[node].copy()
    cpu = int(cluster.cpu_free[node]) + sum(v.placement.pod.cpu_milli for v in plan.victims) - pod.cpu_milli
    for v in plan.victims:
        for g in v.placement.gpus:
            free[g] += v.placement.pod.gpu_milli
    if plan.replicas is not None:
        r = plan.replicas
        free = np.where(cluster.gpu_present[node], GPU_MILLI, 0)
        free[plan.gpus[0]] = (r - 1) * GPU_MILLI // r
    elif pod.is_shared:
        r = int(modes[node])
        free[plan.gpus[0]] -= GPU_MILLI // r
    else:
        for g in plan.gpus:
            free[g] = 0
    if fragmentation is None:
        return float(free.sum())
    value = fragmentation.frag(np.array([cpu], dtype=np.int64), free[None, :].astype(np.int64),
                               cluster.model_idx[node: node + 1])
    return float(value[0])


def engine_preemption(cluster: ClusterState, modes: IntArray, used: IntArray, placed: PlacedPods, pod: PodSpec,
                      priority: PodPriority, own_size: int = 0,
                      fragmentation: FragmentationModel | None = None) -> PreemptionPlan | None:
    """The engine's victims for ``pod`` (module docstring), or None when no preemption makes room."""
    if not priority.preempts:
        return None
    kinds = _kinds(cluster, modes, pod, own_size, reshape=True)
    nodes = _single_victim_nodes(cluster, modes, used, placed, pod, priority, kinds)
    if nodes.size == 0:
        nodes = np.flatnonzero(_upper_bound(cluster, modes, used, placed, pod, priority, kinds))
    plans: list[tuple[tuple[int, int, int, int], PreemptionPlan]] = []
    for node in nodes:
        case = _node_case(cluster, modes, used, placed, pod, priority, int(node), int(kinds[node]))
        if case is None:
            continue
        chosen = _cover(case)
        if chosen is None:
            continue
        plan = _plan_for(cluster, modes, used, case, pod, chosen, own_size)
        plans.append((plan_key([v.priority for v in chosen], plan.preempted_milli, plan.exact), plan))
    if not plans:
        return None
    best = min(key for key, _ in plans)
    tied = [plan for key, plan in plans if key == best]
    if len(tied) == 1:
        return tied[0]
    return min(tied, key=lambda p: (_fragmentation_after(cluster, modes, used, p, pod, fragmentation),
                                    int(cluster.tie_rank[p.node])))


def _reprieve(case: _Node, victims: list[Victim]) -> list[Victim]:
    """kube-scheduler's reprieve on one node: budget violators first, each group most important first."""
    return case.reprieve(victims, sorted(victims, key=lambda v: (not v.violates_budget, -v.priority, v.started, v.key)))


def scheduler_preemption(cluster: ClusterState, modes: IntArray, used: IntArray, placed: PlacedPods, pod: PodSpec,
                         priority: PodPriority, own_size: int = 0, offset: int = 0,
                         max_candidates: int | None = None) -> PreemptionPlan | None:
    """kube-scheduler's default preemption for ``pod`` (module docstring), or None."""
    if not priority.preempts:
        return None
    kinds = _kinds(cluster, modes, pod, own_size, reshape=False)
    fits = np.flatnonzero(_upper_bound(cluster, modes, used, placed, pod, priority, kinds))
    if fits.size == 0:
        return None
    n = len(cluster)
    fits = np.concatenate([fits[fits >= offset % n], fits[fits < offset % n]])
    if max_candidates is not None:
        fits = fits[:max_candidates]
    best: tuple[int, int, int, int, float, int] | None = None
    chosen_plan: PreemptionPlan | None = None
    for position, node in enumerate(fits):
        case = _node_case(cluster, modes, used, placed, pod, priority, int(node), int(kinds[node]))
        if case is None or not case.fits(case.optional):
            continue
        victims = _reprieve(case, case.optional)
        top = max((v.priority for v in victims), default=INT32_MIN - 1)
        # kube sums priorities shifted by MaxInt32+1 so that negative ones count as small, not as gains.
        total = sum(v.priority - INT32_MIN for v in victims)
        latest = min((v.started for v in victims if v.priority == top), default=float("inf"))
        key = (sum(v.violates_budget for v in victims), top, total, len(victims), -latest, position)
        if best is None or key < best:
            best = key
            chosen_plan = _plan_for(cluster, modes, used, case, pod, victims, own_size, REASON_SCHEDULER)
    return chosen_plan

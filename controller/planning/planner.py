"""One planning cycle: which gated pods to release where, and what capacity to create.

Input: a :class:`~controller.state.snapshot.Snapshot` and the time (injected). Output: a
:class:`Plan` that :mod:`controller.operator` applies. Pure and deterministic:
pods are taken in ``sharing.rules.priority.waiting_order``: highest priority
(``spec.priority``, which the API server resolves from the PriorityClass) first,
then oldest, then by name (a preemptor pinned to the place it freed first within
its priority), so a pod never starves behind newer ones of its priority, and
the same snapshot always yields the same plan.

For each gated pod, and each ungated pod kube-scheduler reported Unschedulable
(the capacity it was admitted for went to another pod), in order (a pod that still
carries Kueue's admission gate is not among them: it only gets a ``held`` wait):

1. if capacity for it exists now (free MIG instances, or free replicas on a node
   sharing GPUs the way it asked), choose the node and **release** it (pin to
   the node, lift the gate; an ungated pod is left to kube-scheduler). MIG: best fit, the node with the fewest free
   instances of the profiles it needs; shared: the ``sharing.packing`` engine
   (:mod:`controller.planning.sharedplan`);
2. otherwise, if the capacity can be *created* within the policy's bounds
   (selected by a SharingPolicy, window open, ``maxConcurrent`` not reached, GPU
   idle for ``idleSeconds`` before anything on it is destroyed: the one gate,
   ``sharing.rules.reshape_gate``, that the node agent asks too), plan the
   change (:mod:`controller.planning.migplan`, or a node sharing change) and let the pod
   **wait** for it: its gate is lifted in a later cycle, once the node agent
   reports the new capacity;
3. otherwise, if it is gated (or is a pod asking ``nvidia.com/gpu`` itself that
   kube-scheduler left Unschedulable, ``Pod.plain``) and may preempt, the fewest pods of
   strictly lower priority whose places give it one are **preempted**
   (:mod:`controller.planning.preemption`): the pod is pinned to that node (a plain pod's
   record names it) and waits, its place held, until they are gone, then is released as in 1.
   A node whose every GPU pod was preempted for it (a *reshape*) is held for it and switched
   to what it needs once they are gone (:func:`_reclaim`);
4. otherwise the pod **waits**, with the reason.

Capacity planned in this cycle is reused by the next pods of the same cycle
(batching), so a burst of demand reshapes as few GPUs as possible. Nodes with
a static layout policy are brought to it (idle GPUs only) before any demand.

Cost: a cycle with nothing waiting (and no static layout or whole-GPU demand to
serve) returns at once. Otherwise a pod is placed by looking at candidates, not
at every node: MIG best fit comes from the ledger's per-profile index
(:class:`controller.planning.capacity.MigIndex`), capacity in flight and free whole GPUs
from the names of the nodes that have some, and what depends only on the cycle
(nodes an idle switch could go to) or on a pod's shape (the replica counts it
fits) is computed once. The plans are the ones a scan of every node gives.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import islice
from typing import Final
from datetime import datetime

from controller.planning.capacity import FreeCapacity, unreported_claims
from controller.state.claims import mig_claims, shared_claims, whole_pinned
from controller.planning.migplan import ChangeKind, GpuCandidate, LayoutChange, best_change, engine_reshape
from controller.planning.preemption import (REASON_MIG_RESHAPE, Preemption, choose, preferring_budgets, resume,
                                           still_held)
from controller.planning.sharedplan import SharedPlacer
from controller.state.snapshot import Node, Pod, Snapshot
from mig.model import GpuModel
from mig.reach import plan_reconfiguration
from sharing.api.backend import node_backend
from sharing.api.keys import REPLICAS_LABEL, STRATEGY_LABEL
from sharing.api.kueue_workload import held_message
from sharing.api.modes import NodeSharingMode
from sharing.rules.node_policy import NodePolicy
from sharing.rules.priority import waiting_order
from sharing.packing.preemption import REASON_RESHAPE
from sharing.packing.shared_sequence import EXACT, LARGER, ReplicaStep, place_shared
from sharing.rules.replicas import MAX_REPLICAS, fits_split, most_replicas, replicas_for_demand
from sharing.rules.reshape_gate import idle_long_enough, reshape_gate
from sharing.rules.taints import tolerates


NO_WORKLOAD_AFTER_SECONDS: Final = 30
"""A pod at Kueue's gate with no Workload this old is said to have none ("is Kueue running?"):
a running Kueue makes a plain pod's Workload within a second of its creation."""


@dataclass(frozen=True)
class SharingChange:
    node: str
    mode: NodeSharingMode
    replicas: int
    reason: str = ""


@dataclass(frozen=True)
class Release:
    pod: str
    node: str
    reason: str = ""


@dataclass(frozen=True)
class Wait:
    pod: str
    reason: str
    deferred: bool = False
    """Not judged this cycle (its layout search was left to the next one): no verdict on it yet."""
    coming: bool = False
    """Capacity for it is being created (or planned this cycle): it does not fit *nowhere*."""
    preempting: bool = False
    """It waits for the place its preemption frees (``controller.planning.preemption``): never re-admitted."""
    held: bool = False
    """Held by Kueue (``Pod.queue_held``): not planned at all, whatever the cycle's verdict on capacity."""
    never: bool = False
    """Held by Kueue, which says it can never admit it as its queues stand (``KueueVerdict.never``)."""


def _coming(pod: Pod, reason: str) -> Wait:
    return Wait(pod.key, reason, coming=True)


@dataclass(frozen=True)
class Plan:
    layouts: tuple[LayoutChange, ...] = ()
    sharing: tuple[SharingChange, ...] = ()
    releases: tuple[Release, ...] = ()
    waiting: tuple[Wait, ...] = ()
    preemptions: tuple[Preemption, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.layouts or self.sharing or self.releases or self.preemptions)


@dataclass
class _Cycle:
    snapshot: Snapshot
    now: datetime
    free: FreeCapacity
    budget: dict[tuple[str, ...], int]
    mig_mode_changes: bool = False
    demand: Counter[str] = field(default_factory=Counter)
    """MIG profiles the cycle's waiting pods still need (the layout engine's ``missing``)."""
    recent: dict[str, float] | None = None
    """Recent request mix, decayed per arrival as the simulator does (made when a reshape is
    first considered: it sorts every MIG pod)."""
    layouts: dict[tuple[str, int], LayoutChange] = field(default_factory=dict)
    sharing: dict[str, SharingChange] = field(default_factory=dict)
    planned_shares: Counter[str] = field(default_factory=Counter)
    planned_whole: Counter[str] = field(default_factory=Counter)
    whole_busy: Counter[str] = field(default_factory=Counter)
    """Nodes with whole-GPU pods bound or pinned: never split into replicas under them."""
    waiting: tuple[Pod, ...] = ()
    """The cycle's waiting pods, in waiting order (priority, then oldest)."""
    current: int = 0
    """Index in ``waiting`` of the pod being planned: the ones after it are still to come."""
    by_name: dict[str, Node] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)
    """Each node's place in ``snapshot.nodes``: loops over an index keep the snapshot's order."""
    switchable: list[tuple[Node, NodePolicy]] | None = None
    """Nodes that may be split into replicas this cycle as far as nothing but the pod and the
    policy budget is concerned (:func:`_switchable`); made on first use."""
    returnable: list[Node] | None = None
    """Shared nodes that may return to whole-GPU use as far as nothing but the pod, the budget
    and the GPUs needed is concerned (:func:`_idle_shared_nodes`); made on first use."""
    own_size: dict[tuple[object, ...], int] = field(default_factory=dict)
    """:func:`_own_size` by pod shape and node bounds: pods of one shape ask the same question."""
    own_sizes: dict[tuple[object, ...], dict[str, int]] = field(default_factory=dict)
    """:func:`_own_sizes` by pod shape."""
    mig_searches: int = 0
    """Layout searches made this cycle (:data:`MIG_SEARCHES_PER_CYCLE`)."""
    mig_hopeless: dict[tuple[object, ...], str] = field(default_factory=dict)
    """Pod shapes (:func:`_mig_shape`) a search found no change for this cycle, with the reason."""
    mig_nodes: list[_MigNode] | None = None
    """Nodes a MIG change could go to, and their GPUs as candidates (:func:`_mig_nodes`); made on first use."""
    last_of_shape: dict[str, dict[tuple[object, ...], tuple[int, Pod]]] | None = None
    """Per sharing mode and pod shape, the last waiting pod of that shape and its index (:func:`_kept_for_later`)."""
    held: dict[str, Pod] = field(default_factory=dict)
    """Nodes reclaimed for a preemptor (:func:`reclaimed`), and the preemptor: no replica, whole GPU or
    MIG instance is released there and no one else splits, switches or re-lays them out; the
    preemptor's own switch (:func:`_reclaim`) or layout change (:func:`_reclaim_mig`) is the only
    change planned for them."""
    held_mig: dict[str, tuple[Counter[str], Counter[str]]] = field(default_factory=dict)
    """A held node's free MIG instances and those being created, kept out of the ledger for its preemptor."""

    def in_order(self, names: set[str]) -> list[Node]:
        """The nodes named, in the snapshot's order."""
        return [self.by_name[n] for n in sorted(names, key=self.position.__getitem__) if n in self.by_name]


def _idle_for(idle_since: datetime | None, now: datetime) -> float | None:
    """Seconds a GPU has been idle at ``now`` (the gate's ``idle_for``); None: in use."""
    return None if idle_since is None else (now - idle_since).total_seconds()


def in_flight(snapshot: Snapshot) -> Counter[tuple[str, ...]]:
    """GPUs (and node sharing changes) still being applied, per policy group. A node reclaimed for a
    preemptor (:func:`reclaimed`) counts as a change under way from its preemption on: its switch
    back took the policy's ``maxConcurrent`` slot then, so it never waits on a slot later. (A MIG
    preemptor's layout change takes its slot when it is planned, :func:`_reclaim_mig`: its reshaping
    GPU counts from then on.)"""
    out: Counter[tuple[str, ...]] = Counter()
    held = reclaimed(snapshot)
    for node in snapshot.nodes:
        policy = snapshot.policies.get(node.name)
        if policy is None:
            continue
        out[policy.names] += sum(1 for g in node.gpus if g.reshaping)
        if node.sharing != node.spec_sharing or node.replicas != node.spec_replicas or (
                node.name in held and held[node.name].mode != "mig"):
            out[policy.names] += 1
    return out


def preemptors(snapshot: Snapshot) -> tuple[Pod, ...]:
    """The waiting pods that are not gpupack's, as the planner sees them (``PlainGpuPod.preemptor``)."""
    return tuple(p.preemptor for p in snapshot.plain_gpu_pods if p.preemptor is not None)


def reclaimed(snapshot: Snapshot) -> dict[str, Pod]:
    """Nodes whose GPU pods were preempted for a pod that needs the node switched (a *reshape*), by
    name, with that pod: a gpupack pod pinned there or a plain pod whose record names it, not bound
    yet, while the node's spec is not yet what the pod needs (:func:`_switched_for`). Held for it
    until then (:attr:`_Cycle.held`). A MIG preemptor holds its node until it is released: the
    device plugin, not gpupack, picks the instance a pod released to the node gets, so an instance
    its victims freed, or one created for it, would otherwise go to whoever is released there."""
    by_name = {n.name: n for n in snapshot.nodes}
    out: dict[str, Pod] = {}
    for pod in (*snapshot.pods, *preemptors(snapshot)):
        node = by_name.get(pod.node or "")
        if not pod.victims or pod.bound or node is None:
            continue
        if pod.gated if pod.mode == "mig" else not _switched_for(pod, node):
            out.setdefault(node.name, pod)
    return out


def _switched_for(pod: Pod, node: Node) -> bool:
    """Whether ``node``'s spec already gives ``pod`` its kind of place: whole GPUs, or its mode at a
    split it fits (the preemption of a replica or a whole GPU there needs no switch)."""
    if pod.mode == "whole":
        return node.spec_sharing == "none"
    return node.spec_sharing == pod.mode and fits_split(node.spec_replicas, pod.asks, node.gpu_memory_bytes)


RECENT_DECAY = 0.99
"""Weight a request keeps per later arrival in the recent mix (the simulator's constant)."""


def recent_mix(pods: tuple[Pod, ...]) -> dict[str, float]:
    """Histogram of requested MIG profiles, each weighted ``RECENT_DECAY ** later arrivals``."""
    ordered = sorted((p for p in pods if p.mode == "mig"), key=lambda p: (p.created, p.key))
    mix: dict[str, float] = {}
    for later, pod in enumerate(reversed(ordered)):
        for profile in pod.profiles:
            mix[profile] = mix.get(profile, 0.0) + RECENT_DECAY**later
    return mix


def allowed_on(pod: Pod, node: Node, labels: dict[str, str] | None = None) -> bool:
    """The pod admits the node: its product, its nodeSelector and required affinity (pinning a pod
    to a node its own terms exclude would leave it unschedulable), the node's taints (a pod that
    does not tolerate them stays Pending there, ``sharing.rules.taints``), and the node it is already
    pinned to, if any (a controller that crashed between pinning and lifting the gate must
    finish on that node). ``labels``: the node's labels to judge by (default: its own)."""
    return (
        (not pod.products or node.product in pod.products)
        and (pod.node is None or pod.node == node.name)
        and pod.admits(node.label_map if labels is None else labels)
        and tolerates(pod.tolerations, node.taints)
    )


def _can_take(cycle: _Cycle, pod: Pod, node: Node) -> bool:
    """The pod admits the node (:func:`allowed_on`) and its CPU and memory requests fit in what the
    node's pods, and those released to it this cycle, leave (``FreeCapacity.fits``)."""
    return allowed_on(pod, node) and cycle.free.fits(node.name, pod)


def _shared_mode(pod: Pod) -> NodeSharingMode:
    """The node sharing mode a shared ``pod`` takes a replica of."""
    return "time-slicing" if pod.mode == "time-slicing" else "mps"


def _allowed_after_switch(pod: Pod, node: Node, mode: NodeSharingMode, replicas: int) -> bool:
    """``_allowed`` judged on the labels GPU feature discovery gives the node once it shares
    by ``mode`` into ``replicas`` (the webhook's terms name the sharing the pod needs, which
    an idle node about to be switched does not have yet)."""
    labels = {**node.label_map, STRATEGY_LABEL: mode, REPLICAS_LABEL: str(replicas if mode != "none" else 1)}
    return allowed_on(pod, node, labels)


def _open(policy: NodePolicy | None, cycle: _Cycle, idle_for: Iterable[float | None] = ()) -> bool:
    """The gate (``sharing.rules.reshape_gate``) for a change this cycle plans now on a node under
    ``policy``, whose GPUs it touches have been idle ``idle_for``: what counts against ``maxConcurrent``
    is what ``cycle.budget`` has counted down (changes in flight, and planned this cycle)."""
    in_flight = policy.max_concurrent - cycle.budget.get(policy.names, 0) if policy is not None else 0
    return reshape_gate(policy, cycle.now, in_flight=in_flight, idle_for=idle_for).allowed


@dataclass(frozen=True)
class _MigNode:
    """A node whose GPUs the planner may reshape, with what of each GPU does not depend on the pod
    or on what the cycle has planned so far (made once per cycle, :func:`_mig_nodes`)."""

    node: Node
    model: GpuModel
    policy: NodePolicy
    found: dict[int, GpuCandidate]
    """Per GPU index that may be changed: the GPU as it is (unused instances may go if it is idle)."""
    extend: dict[int, GpuCandidate]
    """The same GPUs, nothing destroyed: only free slices may be used."""


def _mig_nodes(cycle: _Cycle, claims: dict[str, Counter[str]]) -> list[_MigNode]:
    """The nodes with GPUs a MIG change could go to, once per cycle: at fleet size the per-pod
    walk over every GPU (building a candidate for each) was most of a cycle with MIG pods waiting."""
    if cycle.mig_nodes is None:
        cycle.mig_nodes = []
        for node in cycle.snapshot.nodes:
            policy = cycle.snapshot.policies.get(node.name)
            # A layout the engine chooses: the gate's rules that hold for the whole cycle (a policy
            # selects the node, pins no static layout, is not frozen, its window is open). Its budget
            # changes as the cycle plans: ``_mig_candidates`` asks ``_open`` per pod.
            if node.model is None or policy is None or not reshape_gate(policy, cycle.now, dynamic_layout=True).allowed:
                continue
            quiet = not unreported_claims(node, claims.get(node.name, Counter()))
            found: dict[int, GpuCandidate] = {}
            extend: dict[int, GpuCandidate] = {}
            for gpu in node.gpus:
                if gpu.reshaping or gpu.faulted:
                    continue  # a GPU with a fault is never reshaped (node.health)
                if not gpu.mig_enabled and (not cycle.mig_mode_changes or node.sharing != "none"
                                            or node.spec_sharing != "none"):
                    # Turning MIG on needs a GPU reset (operator mode only), and full GPUs
                    # of a shared node belong to its MPS/time-slicing pool.
                    continue
                idle = quiet and not gpu.in_use and idle_long_enough(_idle_for(gpu.idle_since, cycle.now),
                                                                      policy.idle_seconds)
                found[gpu.index] = GpuCandidate(node.name, gpu.index, node.model, gpu.mig_enabled, gpu.instances,
                                                gpu.in_use, idle)
                extend[gpu.index] = replace(found[gpu.index], may_destroy=False) if idle else found[gpu.index]
            cycle.mig_nodes.append(_MigNode(node, node.model, policy, found, extend))
    return cycle.mig_nodes


def _mig_candidates(cycle: _Cycle, pod: Pod, claims: dict[str, Counter[str]], *,
                    extend_only: bool) -> list[GpuCandidate]:
    """The GPUs a change for ``pod`` may go to, in the snapshot's order; with ``extend_only``, as
    changes that destroy nothing. A GPU already changed this cycle may only be added to."""
    planned: dict[str, list[LayoutChange]] = {}
    for change in cycle.layouts.values():
        planned.setdefault(change.node, []).append(change)
    out: list[GpuCandidate] = []
    for entry in _mig_nodes(cycle, claims):
        node, policy = entry.node, entry.policy
        if node.name in cycle.held or not _can_take(cycle, pod, node) \
                or not all(policy.allows_profile(p) for p in pod.profiles):
            continue
        ready = entry.extend if extend_only else entry.found
        changed = planned.get(node.name)
        if changed is None:
            if _open(policy, cycle):
                out.extend(ready.values())
            continue
        by_index = {c.index: c for c in changed}
        is_open = _open(policy, cycle)
        for gpu in node.gpus:
            planned_here = by_index.get(gpu.index)
            if planned_here is not None:
                out.append(GpuCandidate(node.name, gpu.index, entry.model, True, planned_here.layout,
                                        planned_here.layout, False))
            elif is_open and gpu.index in ready:
                out.append(ready[gpu.index])
    return out


MIG_SEARCHES_PER_CYCLE = 200
"""Layout searches (a pod with no free or incoming instance) a cycle makes at most, in waiting order;
the rest wait for the next cycle. Each searches every changeable GPU of the fleet: with a backlog of
thousands, an unbounded cycle grew with the backlog and released nothing for minutes."""


def _mig_shape(pod: Pod) -> tuple[object, ...]:
    """What of a pod a layout search depends on: two pods alike in it find the same GPUs."""
    return (tuple(sorted(pod.profiles)), pod.products, pod.node, pod.node_selector, pod.terms, pod.cpu_milli,
            pod.memory_mib)


def _merge(old: LayoutChange | None, new: LayoutChange) -> LayoutChange:
    if old is None:
        return new
    created = tuple(sorted(set(old.create) | set(new.create)))
    return LayoutChange(old.node, old.index, old.kind, new.layout, old.destroy, created, old.reason + "; " + new.reason)


def _plan_mig(cycle: _Cycle, pod: Pod, claims: dict[str, Counter[str]]) -> Release | Wait:
    need = Counter(pod.profiles)
    node: str | None
    if need:
        node = cycle.free.best_mig(need, lambda name: _can_take(cycle, pod, cycle.by_name[name]))
    else:  # nothing to look up in the index: every node the pod admits fits
        fitting = [n.name for n in cycle.snapshot.nodes if _can_take(cycle, pod, n)]
        node = min(fitting, key=lambda name: (sum(cycle.free.mig_free(name).values()), name)) if fitting else None
    if node is not None:
        cycle.free.take_mig(node, pod.profiles)
        return Release(pod.key, node, f"free {', '.join(sorted(pod.profiles))} on {node}")
    for n in cycle.in_order(cycle.free.incoming_mig_nodes):
        incoming = cycle.free.incoming_mig.get(n.name)
        if incoming and _can_take(cycle, pod, n) and all(incoming[p] >= k for p, k in need.items()):
            incoming.subtract(need)
            return _coming(pod, f"capacity being created: {', '.join(sorted(pod.profiles))} on {n.name} (in flight)")
    shape = _mig_shape(pod)
    if shape in cycle.mig_hopeless:
        return Wait(pod.key, cycle.mig_hopeless[shape])
    if cycle.mig_searches >= MIG_SEARCHES_PER_CYCLE:
        return Wait(pod.key, f"capacity for {', '.join(sorted(pod.profiles))} is searched for in the next cycle "
                             f"(at most {MIG_SEARCHES_PER_CYCLE} layout searches a cycle, in waiting order)",
                    deferred=True)
    cycle.mig_searches += 1
    # Cheapest first: create in free slices (nothing destroyed, no idle time needed);
    # then the simulator's layout engine on idle GPUs; then the fewest-destroys change
    # (for idle GPUs whose policy forbids every layout the engine would pick).
    change = best_change(_mig_candidates(cycle, pod, claims, extend_only=True), pod.profiles)
    candidates: list[GpuCandidate] = []
    if change is None:
        candidates = _mig_candidates(cycle, pod, claims, extend_only=False)
        policies = cycle.snapshot.policies
        if cycle.recent is None:
            cycle.recent = recent_mix(cycle.snapshot.pods)
        change = engine_reshape(candidates, pod.profiles, cycle.demand, cycle.recent,
                                lambda node, profile: policies[node].allows_profile(profile))
    if change is None:
        change = best_change(candidates, pod.profiles)
    if change is None:
        reason = (f"no free {', '.join(sorted(pod.profiles))} and no GPU may be reshaped for it now "
                  "(policy selector, allowed profiles, window, maxConcurrent, idle time)")
        # Nothing this cycle plans later gives a pod of this shape more: capacity and budget only
        # shrink, and a GPU changed for another pod has fewer free slices than before.
        cycle.mig_hopeless[shape] = reason
        return Wait(pod.key, reason)
    key = (change.node, change.index)
    if key not in cycle.layouts:
        policy = cycle.snapshot.policies[change.node]
        cycle.budget[policy.names] -= 1
    cycle.layouts[key] = _merge(cycle.layouts.get(key), change)
    # Instances about to be destroyed are no longer free; the new ones beyond this
    # pod's are capacity in flight for the next pods of the cycle.
    cycle.free.destroy_mig(change.node, (i.profile for i in change.destroy))
    spare = Counter(i.profile for i in change.create) - Counter(pod.profiles)
    cycle.free.add_incoming_mig(change.node, spare)
    return _coming(pod, f"capacity being created: {change.reason}")


def _idle_shared_nodes(cycle: _Cycle, taken: Counter[str], gpus: int, pod: Pod | None) -> list[Node]:
    """Shared nodes that may return to whole-GPU use now: converged, policy window open and
    budget left, every GPU idle long enough, no replica claimed, at least ``gpus`` GPUs."""
    if cycle.returnable is None:
        cycle.returnable = []
        for node in cycle.snapshot.nodes:
            if node.spec_sharing == "none" or not node.converged or taken[node.name]:
                continue
            if any(g.mig_enabled for g in node.gpus) or node.faulted:
                continue
            # The gate's rules that hold for the whole cycle, every GPU idle long enough; the
            # budget is asked per pod below.
            if reshape_gate(cycle.snapshot.policies.get(node.name), cycle.now,
                            idle_for=(_idle_for(g.idle_since, cycle.now) for g in node.gpus)).allowed:
                cycle.returnable.append(node)
    out = [
        node for node in cycle.returnable
        if node.name not in cycle.sharing and node.name not in cycle.held
        and _open(cycle.snapshot.policies.get(node.name), cycle)
        and len(node.full_gpus) >= gpus
        and (pod is None or (_allowed_after_switch(pod, node, "none", 1) and cycle.free.fits(node.name, pod)))
    ]
    return sorted(out, key=lambda n: (len(n.full_gpus), n.name))


def _switch_back(cycle: _Cycle, node: Node, why: str, reserved: bool = False) -> None:
    """Plan ``node``'s return to whole GPUs; ``reserved``: its ``maxConcurrent`` slot is taken already
    (a node reclaimed for a preemptor, :func:`in_flight`)."""
    policy = cycle.snapshot.policies[node.name]
    if not reserved:
        cycle.budget[policy.names] -= 1
    cycle.sharing[node.name] = SharingChange(node.name, "none", 1, why)
    cycle.planned_whole[node.name] = len(node.full_gpus)


def _reclaim(cycle: _Cycle, pod: Pod, taken: Counter[str]) -> Wait:
    """A preemptor whose victims on a node it reclaimed are gone (:attr:`_Cycle.held`): the node is
    switched for it (back to whole GPUs, or split by its mode at its own size) once the node agent
    reports its GPUs unused (a process outlives its pod object by a poll) and the policy's window is
    open; its ``maxConcurrent`` slot is held since the preemption. The idle-time rule
    (``idleSeconds``) is not asked: it keeps a reshape from destroying a GPU's work while that may
    still return, and here the work was preempted on purpose for this pod; waiting longer would only
    keep the pod from the GPUs nothing else may take."""
    node = cycle.by_name[pod.node or ""]
    policy = cycle.snapshot.policies.get(node.name)
    if (taken[node.name] or cycle.whole_busy[node.name] or not node.converged
            or any(g.idle_since is None for g in node.full_gpus)):
        return Wait(pod.key, f"waiting on {node.name}, reclaimed for it, for its GPUs to be reported unused",
                    preempting=True)
    in_flight = policy.max_concurrent - cycle.budget.get(policy.names, 0) - 1 if policy is not None else 0
    if policy is None or not reshape_gate(policy, cycle.now, in_flight=in_flight).allowed:
        return Wait(pod.key, f"waiting on {node.name}, reclaimed for it, for its policy's window to switch it",
                    preempting=True)
    if pod.mode == "whole":
        _switch_back(cycle, node, f"reclaimed for {pod.key}, which needs {pod.whole_gpus} whole GPU(s)", reserved=True)
        cycle.planned_whole[node.name] -= pod.whole_gpus
        return Wait(pod.key, f"capacity being created: {node.name}, reclaimed for it, returning to whole GPUs",
                    coming=True, preempting=True)
    mode = _shared_mode(pod)
    replicas = _reclaim_split(pod, node, policy)
    if not replicas:
        return Wait(pod.key, f"waiting on {node.name}, reclaimed for it: no split its policy allows fits it",
                    preempting=True)
    cycle.sharing[node.name] = SharingChange(node.name, mode, replicas, f"reclaimed for {pod.key}, which needs {mode}")
    cycle.planned_shares[node.name] = len(node.full_gpus) * replicas - pod.shares
    return Wait(pod.key, f"capacity being created: {node.name}, reclaimed for it, switching to {mode} x{replicas}",
                coming=True, preempting=True)


def _reclaim_split(pod: Pod, node: Node, policy: NodePolicy) -> int:
    """The replica count a node reclaimed for a shared ``pod`` is split into: its own size there (the most
    replicas its policy allows that the pod fits, on the labels the split gives the node; 0: none)."""
    mode = _shared_mode(pod)
    return most_replicas(pod.asks, node.gpu_memory_bytes, policy.min_replicas, policy.max_replicas,
                         admits=partial(_allowed_after_switch, pod, node, mode))


def _may_reclaim(cycle: _Cycle, pod: Pod, node: Node) -> bool:
    """Whether ``node`` may be reclaimed for ``pod`` now: the policy gate for its switch (back to whole
    GPUs, or to the pod's mode at its own size; for a MIG pod, a layout gpupack chooses, of profiles
    the policy allows, on one of its GPUs) is open (a policy selects it, window open,
    ``maxConcurrent`` not reached; idle time aside, :func:`_reclaim`), nothing else is planned for it
    this cycle, and the pod admits it once switched. A node whose gate is shut is never reclaimed:
    its pod would wait on GPUs that may not be switched for it."""
    policy = cycle.snapshot.policies.get(node.name)
    if node.name in cycle.sharing or node.name in cycle.held or policy is None or not _open(policy, cycle):
        return False
    if pod.mode == "mig":
        return reshape_gate(policy, cycle.now, dynamic_layout=True).allowed and all(
            policy.allows_profile(p) for p in pod.profiles)
    if pod.mode == "whole":
        return _allowed_after_switch(pod, node, "none", 1)
    return bool(_reclaim_split(pod, node, policy))


def _may_preempt_on(cycle: _Cycle, pod: Pod, node: Node) -> bool:
    """The pod admits ``node`` (:func:`allowed_on`) and no other preemptor holds it."""
    holder = cycle.held.get(node.name)
    return allowed_on(pod, node) and (holder is None or holder is pod)


def _hold(cycle: _Cycle, node: str, pod: Pod) -> None:
    """Keep ``node`` for ``pod`` (:attr:`_Cycle.held`): none of its replicas, whole GPUs or MIG instances
    (free or being created) is released to another pod."""
    cycle.held[node] = pod
    cycle.free.shared[node] = 0
    cycle.free.whole[node] = 0
    free = Counter(cycle.free.mig_free(node))
    cycle.free.destroy_mig(node, free.elements())
    cycle.held_mig[node] = (free, cycle.free.incoming_mig.pop(node, Counter()))
    cycle.free.incoming_mig_nodes.discard(node)


def _reclaim_mig(cycle: _Cycle, pod: Pod, claims: dict[str, Counter[str]]) -> Release | Wait:
    """A MIG preemptor whose victims are gone, on the node held for it: released to the free instances
    of its profiles there; else it waits for the instances its victims held, when they are of its
    profiles (reported in use by pods that are gone: a process outlives its pod object by a poll);
    else one of the node's GPUs is re-laid out for it, destroying only instances no pod is reported
    on (``migplan.best_change``, the in-use ones pinned), once every pod claiming an instance there is
    reported on one and its policy's gate is open (window, ``maxConcurrent``, profiles allowed). The
    idle-time rule is not asked here (see :func:`_reclaim`); the node agent keeps its own per instance."""
    node = cycle.by_name[pod.node or ""]
    free, incoming = cycle.held_mig.get(node.name, (Counter(), Counter()))
    need = Counter(pod.profiles)
    profiles = ", ".join(sorted(pod.profiles))
    if all(free[p] >= n for p, n in need.items()):
        free.subtract(need)
        return Release(pod.key, node.name, f"free {profiles} on {node.name}, held for it")
    if any(g.reshaping for g in node.gpus):
        return Wait(pod.key, f"capacity being created: a GPU of {node.name}, held for it, is being re-laid out",
                    coming=True, preempting=True)
    alive = {p.key for p in cycle.snapshot.pods}
    freeing = Counter(i.profile for g in node.gpus if g.mig_enabled for i, users in g.users
                      if not set(users) & alive)
    if all(free[p] + freeing[p] >= n for p, n in need.items()):
        return Wait(pod.key, f"waiting on {node.name}, held for it, for the {profiles} its victims held to be "
                             "reported unused", preempting=True)
    if unreported_claims(node, claims.get(node.name, Counter())):
        return Wait(pod.key, f"waiting on {node.name}, held for it, for the node agent to report which instances "
                             "its pods use", preempting=True)
    policy = cycle.snapshot.policies.get(node.name)
    if policy is None or node.model is None or not _open(policy, cycle) \
            or not reshape_gate(policy, cycle.now, dynamic_layout=True).allowed \
            or not all(policy.allows_profile(p) for p in pod.profiles):
        return Wait(pod.key, f"waiting on {node.name}, held for it, for its policy's gate to re-lay out a GPU "
                             "(window, maxConcurrent, allowed profiles)", preempting=True)
    candidates = [GpuCandidate(node.name, g.index, node.model, True, g.instances, g.in_use, True)
                  for g in node.gpus if g.mig_enabled and not g.reshaping and not g.faulted]
    change = best_change(candidates, pod.profiles)
    if change is None:
        return Wait(pod.key, f"waiting on {node.name}, held for it, for the instances its victims held to be "
                             "reported unused", preempting=True)
    cycle.budget[policy.names] -= 1
    cycle.layouts[(change.node, change.index)] = _merge(cycle.layouts.get((change.node, change.index)), change)
    incoming.update(Counter(i.profile for i in change.create) - need)
    return Wait(pod.key, f"capacity being created: {change.reason} (held for it)", coming=True, preempting=True)


def _plan_whole(cycle: _Cycle, pod: Pod, placer: SharedPlacer, taken: Counter[str]) -> Release | Wait:
    """A ``whole`` pod: the engine's choice among nodes with free whole GPUs; else an idle
    shared node switched back to whole-GPU use (``sharing.packing.node_sharing``)."""
    need = pod.whole_gpus
    # Free whole GPUs only decrease during a cycle: the nodes that had some are the candidates.
    nodes = cycle.in_order(cycle.free.whole_nodes) if need > 0 else cycle.snapshot.nodes
    fitting = [n for n in nodes if cycle.free.whole[n.name] >= need and _can_take(cycle, pod, n)]
    node = placer.place_whole(pod, fitting, dict(cycle.free.whole))
    if node is not None:
        cycle.free.take_whole(node, need)
        return Release(pod.key, node, f"{need} whole GPU(s) on {node} (packing engine)")
    incoming = cycle.in_order(cycle.free.incoming_whole_nodes) if need > 0 else cycle.snapshot.nodes
    for n in incoming:
        if cycle.free.incoming_whole[n.name] >= need and _can_take(cycle, pod, n):
            cycle.free.incoming_whole[n.name] -= need
            return _coming(pod, f"capacity being created: {n.name} returning to whole GPUs (in flight)")
    for name, change in sorted(cycle.sharing.items()):
        if change.mode == "none" and cycle.planned_whole[name] >= need and cycle.free.fits(name, pod) \
                and _allowed_after_switch(pod, cycle.by_name[name], "none", 1):
            cycle.planned_whole[name] -= need
            return _coming(pod, f"capacity being created: {name} returning to whole GPUs")
    idle = _idle_shared_nodes(cycle, taken, need, pod)
    if not idle:
        return Wait(pod.key, f"no node has {need} free whole GPU(s), and no idle shared node may return to whole-GPU "
                             "use now (policy selector, window, maxConcurrent, idle time)")
    _switch_back(cycle, idle[0], f"{pod.key} needs {need} whole GPU(s)")
    cycle.planned_whole[idle[0].name] -= need
    return _coming(pod, f"capacity being created: {idle[0].name} returning to whole GPUs")


def _own_size(cycle: _Cycle, pod: Pod, node: Node) -> int:
    """The replica count a split of ``node`` could give ``pod`` at most (its policy's bounds;
    the device plugin's without one), 0 when none fits."""
    policy = cycle.snapshot.policies.get(node.name)
    top, bottom = (policy.max_replicas, policy.min_replicas) if policy is not None else (MAX_REPLICAS, 1)
    memory = node.gpu_memory_bytes
    key = (pod.milli, pod.memory_bytes, memory, top, bottom)
    size = cycle.own_size.get(key)
    if size is None:
        size = cycle.own_size[key] = most_replicas(pod.asks, memory, bottom, top)
    return size


def _own_sizes(cycle: _Cycle, pod: Pod, placer: SharedPlacer) -> dict[str, int]:
    """:func:`_own_size` of every shared node, once per pod shape and cycle (never changed by its users)."""
    key = (pod.milli, pod.memory_bytes)
    sizes = cycle.own_sizes.get(key)
    if sizes is None:
        sizes = cycle.own_sizes[key] = {n.name: _own_size(cycle, pod, n) for n in placer.nodes}
    return sizes


def _kept_for_later(cycle: _Cycle, mode: str, node: Node) -> bool:
    """Whether a pod still to come this cycle, of ``mode``, has ``node``'s current split as its own
    size. An idle node split for a burst (``_replicas_for_demand``) is then kept for the burst
    rather than split again for the first pod of another size, which, with a backlog, split the
    same nodes back and forth while both sizes waited."""
    if cycle.last_of_shape is None:
        cycle.last_of_shape = {}
        for index, waiting in enumerate(cycle.waiting):
            if waiting.shares > 0:
                cycle.last_of_shape.setdefault(waiting.mode, {})[(waiting.milli, waiting.memory_bytes)] = (index, waiting)
    return any(index > cycle.current and _own_size(cycle, later, node) == node.replicas
               for index, later in cycle.last_of_shape.get(mode, {}).values())


def _switchable(cycle: _Cycle, taken: Counter[str]) -> list[tuple[Node, NodePolicy]]:
    """Nodes an idle split could go to, judged on everything that does not change within the
    cycle (the policy's budget and the nodes switched this cycle do, and are checked per pod)."""
    if cycle.switchable is None:
        cycle.switchable = []
        for node in cycle.snapshot.nodes:
            policy = cycle.snapshot.policies.get(node.name)
            if policy is None:  # the gate below refuses it too; the pair needs the policy
                continue
            if not node.converged or not node.gpus or any(g.mig_enabled for g in node.gpus) or taken[node.name]:
                continue
            if node.faulted:
                continue  # a GPU with a fault is never shared (node.health)
            if cycle.whole_busy[node.name] or node.name in cycle.held:
                continue
            # The gate's rules that hold for the whole cycle, every GPU idle long enough; the
            # budget is asked per pod (``_open``).
            if not reshape_gate(policy, cycle.now, idle_for=(_idle_for(g.idle_since, cycle.now) for g in node.gpus)).allowed:
                continue
            cycle.switchable.append((node, policy))
    return cycle.switchable


def _take_replica(cycle: _Cycle, pod: Pod, placer: SharedPlacer, why: str,
                  own_size: dict[str, int] | None = None, prefer: bool = False) -> Release | None:
    """``pod`` released to the free replica the engine picks (of its own size per node with
    ``own_size``, else waste first; with ``prefer``, on a node of its priority only), the replicas
    taken; None when none fits."""
    node = placer.place(pod, dict(cycle.free.shared), own_size=own_size, prefer=prefer)
    if node is None:
        return None
    cycle.free.take_shared(node, pod.shares)
    return Release(pod.key, node, f"{pod.mode} replica on {node} (packing engine{why})")


class _SharedSteps:
    """The planner's steps of ``sharing.packing.shared_sequence.place_shared`` for one shared pod:
    the engine's choices (``SharedPlacer``) over the cycle's ledger, capacity in flight or
    planned this cycle, and splits sized for the waiting demand the cycle sees. ``prefer``: free
    replicas only on nodes whose GPU pods all have the pod's priority (``priority_affinity``)."""

    def __init__(self, cycle: _Cycle, pod: Pod, placer: SharedPlacer, taken: Counter[str], prefer: bool = False) -> None:
        self.prefer = prefer
        self.cycle = cycle
        self.pod = pod
        self.placer = placer
        self.taken = taken
        self.mode = _shared_mode(pod)
        self._idle: list[tuple[Node, int]] | None = None

    def replica(self, step: ReplicaStep) -> Release | None:
        cycle, pod = self.cycle, self.pod
        own = _own_sizes(cycle, pod, self.placer) if step == EXACT else None
        why = "; no idle node to split into few replicas" if step == LARGER else ""
        return _take_replica(cycle, pod, self.placer, why, own, prefer=self.prefer)

    def coming(self) -> Wait | None:
        cycle, pod = self.cycle, self.pod
        incoming = cycle.in_order(cycle.free.incoming_shared_nodes) if pod.shares > 0 else cycle.snapshot.nodes
        for n in incoming:
            # Judged on the labels the node will carry once its switch is done: its current ones
            # may not name the sharing the pod's terms ask for yet, and judged on those the pod
            # would never count this capacity and another idle node would be split for it.
            if (n.spec_sharing == pod.mode and cycle.free.incoming_shared[n.name] >= pod.shares
                    and _allowed_after_switch(pod, n, n.spec_sharing, n.spec_replicas) and cycle.free.fits(n.name, pod)
                    and _shared_ok(pod, n, n.spec_replicas)):
                cycle.free.incoming_shared[n.name] -= pod.shares
                return _coming(pod, f"capacity being created: {n.name} switching to {pod.mode} x{n.spec_replicas} (in flight)")
        for name, change in sorted(cycle.sharing.items()):
            target = cycle.by_name[name]
            if (change.mode == pod.mode and cycle.planned_shares[name] >= pod.shares and _shared_ok(pod, target, change.replicas)
                    and _allowed_after_switch(pod, target, change.mode, change.replicas) and cycle.free.fits(name, pod)):
                cycle.planned_shares[name] -= pod.shares
                return _coming(pod, f"capacity being created: {name} switching to {change.mode} x{change.replicas}")
        return None

    def idle(self) -> list[tuple[Node, int]]:
        """The idle nodes that may be split for the pod, each with its own size there (the most
        replicas its policy allows that the pod fits, on the labels the split gives the node)."""
        if self._idle is None:
            cycle, pod, mode = self.cycle, self.pod, self.mode
            self._idle = []
            for node_, policy in _switchable(cycle, self.taken):
                if node_.name in cycle.sharing or not _open(policy, cycle) or not cycle.free.fits(node_.name, pod):
                    continue
                own = most_replicas(pod.asks, node_.gpu_memory_bytes, policy.min_replicas, policy.max_replicas,
                                    admits=partial(_allowed_after_switch, pod, node_, mode))
                if not own or (node_.sharing == pod.mode and node_.replicas == own):
                    continue
                if node_.sharing == pod.mode and _kept_for_later(cycle, pod.mode, node_):
                    continue
                self._idle.append((node_, own))
        return self._idle

    def idle_split(self, small_only: bool) -> tuple[Node, int] | None:
        # The engine's policy chooses which idle node to split (sharing.packing.node_sharing).
        return self.placer.switch(self.pod, self.idle(), small_only=small_only)

    def split(self, choice: tuple[Node, int]) -> Release | Wait:
        cycle, pod, mode = self.cycle, self.pod, self.mode
        chosen, _ = choice
        policy = cycle.snapshot.policies[chosen.name]
        replicas = _replicas_for_demand(cycle, pod, chosen, mode, policy)
        if chosen.sharing == mode and chosen.replicas == replicas:
            # The demand wants the split the node has: a switch would change nothing, and the pod
            # would wait on it for ever. It takes a replica as the nodes are.
            why = "; the waiting pods keep the splits"
            released = _take_replica(cycle, pod, self.placer, why, prefer=self.prefer)
            if released is None and self.prefer:
                released = _take_replica(cycle, pod, self.placer, why)
            if released is not None:
                return released
            return Wait(pod.key, f"no node shares GPUs by {pod.mode} with a free replica that fits")
        cycle.budget[policy.names] -= 1
        cycle.sharing[chosen.name] = SharingChange(chosen.name, mode, replicas, f"{pod.key} needs {mode}")
        cycle.planned_shares[chosen.name] = len(chosen.gpus) * replicas - pod.shares
        self.placer.record(chosen.name, pod.priority.value)
        return _coming(pod, f"capacity being created: {chosen.name} switching to {pod.mode} x{replicas}")


def _plan_shared(cycle: _Cycle, pod: Pod, placer: SharedPlacer, taken: Counter[str]) -> Release | Wait:
    """A shared pod: a free replica, capacity being created, or an idle node split, in the order
    ``sharing.packing.shared_sequence`` gives the live planner and the product model alike: first
    with free replicas only on nodes of the pod's priority, then on any (as the product model does,
    ``sharing.packing.priority_affinity``); a pass that places nothing commits nothing."""
    outcome = None
    if placer.mixes(pod):
        outcome = place_shared(_SharedSteps(cycle, pod, placer, taken, prefer=True), placer.policy)
    if outcome is None:
        outcome = place_shared(_SharedSteps(cycle, pod, placer, taken), placer.policy)
    if outcome is None:
        return Wait(pod.key, f"no node shares GPUs by {pod.mode} with a free replica that fits, and no idle node "
                             "may be switched to it now (policy selector, window, maxConcurrent, idle time)")
    return outcome


DEMAND_LOOKAHEAD = 256
"""Waiting pods a node's replica count is chosen for, at most: enough for a burst onto one
node (8 GPUs x 8 replicas is 64 pods), bounded so a fleet's backlog costs a cycle little."""


def _replicas_for_demand(cycle: _Cycle, pod: Pod, node: Node, mode: NodeSharingMode, policy: NodePolicy) -> int:
    """The replica count ``node`` is split into for ``pod`` (``replicas.replicas_for_demand``, in the
    policy's bounds): the demand is the pod and the waiting pods after it of the same mode, in
    waiting order, each judged on the labels the split gives the node."""
    later = (p for p in cycle.waiting[cycle.current + 1 :] if p.mode == pod.mode)
    demand = [pod, *islice(later, DEMAND_LOOKAHEAD)]
    return replicas_for_demand(
        [p.asks for p in demand], gpus=len(node.full_gpus), gpu_memory_bytes=node.gpu_memory_bytes,
        minimum=policy.min_replicas, maximum=policy.max_replicas,
        admits=lambda index, replicas: _allowed_after_switch(demand[index], node, mode, replicas))


def _whole_demand_elsewhere(cycle: _Cycle, taken: Counter[str], planned: int) -> None:
    """Pods that are not gpupack's wait for ``nvidia.com/gpu`` kube-scheduler found nowhere:
    idle shared nodes return to whole-GPU use until the free and incoming whole GPUs cover them.
    ``planned``: the GPUs of those the cycle planned one by one (``preemptors``), left out here."""
    short = cycle.snapshot.whole_waiting - planned
    short -= sum(cycle.free.whole.values()) + sum(cycle.free.incoming_whole.values())
    short -= sum(cycle.planned_whole.values())
    for node in _idle_shared_nodes(cycle, taken, 1, None):
        if short <= 0:
            return
        if _open(cycle.snapshot.policies.get(node.name), cycle):
            _switch_back(cycle, node, f"{cycle.snapshot.whole_waiting} whole GPU(s) asked by unschedulable pods")
            short -= len(node.full_gpus)


def _shared_ok(pod: Pod, node: Node, replicas: int) -> bool:
    return fits_split(replicas, pod.asks, node.gpu_memory_bytes)


def _static_layouts(cycle: _Cycle) -> None:
    for node in cycle.snapshot.nodes:
        policy = cycle.snapshot.policies.get(node.name)
        if node.model is None or policy is None or policy.static_layout is None or node.name in cycle.held:
            continue
        for gpu in node.gpus:
            if gpu.reshaping or gpu.in_use or gpu.faulted:
                continue
            if not gpu.mig_enabled and not cycle.mig_mode_changes:
                continue
            if gpu.mig_enabled and sorted(gpu.profiles.elements()) == list(policy.static_layout):
                continue
            if not _open(policy, cycle, (_idle_for(gpu.idle_since, cycle.now),)):
                continue
            plan = plan_reconfiguration(node.model, gpu.instances if gpu.mig_enabled else (), (), policy.static_layout)
            if plan is None:
                continue
            kind: ChangeKind = "reshape" if gpu.mig_enabled else "enable"
            why = f"static layout of {','.join(policy.names)} on GPU {gpu.index} of {node.name}"
            cycle.layouts[(node.name, gpu.index)] = LayoutChange(node.name, gpu.index, kind, plan.target, plan.destroy, plan.create, why)
            cycle.budget[policy.names] -= 1


def waiting_key(pod: Pod) -> tuple[int, bool, float, str]:
    """``sharing.rules.priority.waiting_order``, with one addition inside a priority: a pod that preempted
    and is pinned to the place it freed comes first, so an older pod of its priority never takes that
    place (kube-scheduler likewise counts a nominated pod of equal or higher priority as already on its
    node when it places others)."""
    priority, created, name = waiting_order(pod.priority.value, pod.created.timestamp(), pod.key)
    return priority, not (pod.victims and pod.node is not None), created, name


def plan(snapshot: Snapshot, now: datetime, *, policy_name: str = "gpupack", mig_mode_changes: bool = False,
         protected: frozenset[str] = frozenset()) -> Plan:
    """The plan for one cycle (see the module docstring).

    ``protected``: pods a PodDisruptionBudget protects now (``controller.planning.budgets``):
    preemption takes other victims where it can, and these only where nothing else makes room.

    ``mig_mode_changes``: also turn MIG on for idle full GPUs. Off by default: a MIG
    mode change needs a GPU reset, which only the GPU Operator's mig-manager
    (the agent's operator mode) performs; a direct-mode agent refuses it.
    """
    # A node whose agent is silent is left out: its free capacity and the capacity being
    # created there may never come (the agent applies layouts and reports them), so pods
    # are planned elsewhere and its reshapes in flight do not hold its policy's budget.
    # A degraded node (a GPU fault the device plugin keeps advertising) is left out the same way:
    # the kubelet could hand a new pod the failing device.
    # The DRA node pool and its pods are controller.planning.draplan's: kube-scheduler allocates devices
    # there from ResourceSlices, and nothing this planner counts or writes applies to them.
    snapshot = replace(snapshot, nodes=tuple(n for n in snapshot.nodes if not n.stale and not n.degraded
                                            and node_backend(n.label_map) != "dra"),
                       pods=tuple(p for p in snapshot.pods if p.backend != "dra"))
    # Kueue's quota comes first: a pod still at Kueue's admission gate is no demand (nothing is
    # reshaped, split or reserved for it, and it shapes no engine choice); it is only reported.
    held = tuple(held_by_kueue(p, snapshot, now) for p in snapshot.pods if p.queue_held and p.gated)
    snapshot = replace(snapshot, pods=tuple(p for p in snapshot.pods if not p.queue_held))
    budget_in_flight = in_flight(snapshot)
    budget = {p.names: p.max_concurrent - budget_in_flight[p.names] for p in snapshot.policies.values()}
    plain = preemptors(snapshot)
    waiting_pods = sorted((*(p for p in snapshot.pods if p.gated or p.unschedulable), *plain), key=waiting_key)
    if not waiting_pods and snapshot.whole_waiting <= 0 and not any(
            p.static_layout is not None for p in snapshot.policies.values()):
        # Nothing waits and no policy pins a layout: every step below would find nothing to do.
        return Plan(waiting=held)
    claims = mig_claims(snapshot.pods)
    cycle = _Cycle(snapshot, now, FreeCapacity.of(snapshot, claims), budget, mig_mode_changes)
    cycle.by_name = {n.name: n for n in snapshot.nodes}
    cycle.position = {n.name: i for i, n in enumerate(snapshot.nodes)}
    cycle.demand = Counter(prof for p in waiting_pods if p.mode == "mig" for prof in p.profiles)
    for name, preemptor in reclaimed(snapshot).items():
        _hold(cycle, name, preemptor)
    _static_layouts(cycle)
    taken = shared_claims(snapshot.pods)
    placer = SharedPlacer(snapshot.nodes, dict(cycle.free.shared), snapshot.pods, policy_name, room=cycle.free.room,
                          plain=snapshot.plain_gpu_pods)
    cycle.whole_busy = whole_pinned(snapshot.pods) + Counter({n.name: n.whole_taken for n in snapshot.nodes})
    releases: list[Release] = []
    waiting: list[Wait] = []
    preemptions: list[Preemption] = []
    running = {p.uid: p for p in snapshot.pods if p.uid}
    doomed: set[str] = set()
    """Pods chosen as victims this cycle: never chosen twice."""
    cycle.waiting = tuple(waiting_pods)
    for index, pod in enumerate(cycle.waiting):
        cycle.current = index
        left = still_held(pod, snapshot, running)
        outcome: Release | Wait
        if pod.node in cycle.held and cycle.held[pod.node] is pod:
            if left is not None:
                outcome = Wait(pod.key, "its victims are terminating")
            elif pod.mode == "mig":
                outcome = _reclaim_mig(cycle, pod, claims)
            else:
                outcome = _reclaim(cycle, pod, taken)
        elif pod.mode == "mig":
            outcome = _plan_mig(cycle, pod, claims)
        elif pod.mode == "whole":
            outcome = _plan_whole(cycle, pod, placer, taken)
        else:
            outcome = _plan_shared(cycle, pod, placer, taken)
        if pod.mode == "mig":
            cycle.demand.subtract(Counter(pod.profiles))
            cycle.demand = +cycle.demand
        if isinstance(outcome, Release) and not pod.gated:
            # Ungated: kube-scheduler places it; the capacity is only held for it this cycle.
            outcome = Wait(pod.key, f"capacity exists on {outcome.node}; kube-scheduler retries the pod")
        if left is not None:
            # Its victims still hold the place (kube-scheduler counts a terminating pod's requests
            # until it is gone): the place is held for it, and it never preempts again meanwhile.
            again = resume(pod, left)
            if again is not None:
                preemptions.append(again)
                doomed.update(v.key for v in again.victims)
            if isinstance(outcome, Release):
                cycle.free.take_room(outcome.node, pod)
            outcome = Wait(pod.key, f"waiting on {pod.node} for {left.count} pod(s) it preempted to terminate",
                           preempting=True)
        elif isinstance(outcome, Wait) and not (outcome.deferred or outcome.coming or outcome.preempting):
            reclaim = partial(_may_reclaim, cycle, pod)
            # A node held for another preemptor is its alone: nobody else preempts there.
            admits = partial(_may_preempt_on, cycle, pod)
            chosen = preferring_budgets(lambda spared: choose(pod, snapshot.nodes, cycle.free, snapshot.pods,
                                                              spared=spared, admits=admits, reclaim=reclaim),
                                        doomed, protected)
            if chosen is not None:
                preemptions.append(chosen)
                doomed.update(v.key for v in chosen.victims)
                if chosen.kind == REASON_RESHAPE:
                    # Its switch back takes the policy's maxConcurrent slot now (``in_flight``).
                    cycle.budget[cycle.snapshot.policies[chosen.node].names] -= 1
                    _hold(cycle, chosen.node, pod)
                elif chosen.kind == REASON_MIG_RESHAPE:
                    _hold(cycle, chosen.node, pod)
                outcome = Wait(pod.key, f"preempting {len(chosen.victims)} pod(s) of lower priority on {chosen.node}; "
                                        f"{outcome.reason}", preempting=True)
        if isinstance(outcome, Release):
            cycle.free.take_room(outcome.node, pod)
            releases.append(outcome)
        elif not pod.plain:  # a pod that is not gpupack's gets no placement status from it
            waiting.append(outcome)
    _whole_demand_elsewhere(cycle, taken, sum(p.whole_gpus for p in plain))
    return Plan(
        layouts=tuple(cycle.layouts[k] for k in sorted(cycle.layouts)),
        sharing=tuple(cycle.sharing[k] for k in sorted(cycle.sharing)),
        releases=tuple(releases),
        waiting=(*waiting, *held),
        preemptions=tuple(preemptions),
    )


def held_by_kueue(pod: Pod, snapshot: Snapshot, now: datetime) -> Wait:
    """The wait of a pod Kueue still holds (``Pod.queue_held``), in Kueue's words where its Workload
    gives them (``Snapshot.kueue``): it is planned once Kueue lifts its gate."""
    verdict = snapshot.kueue.get(pod.uid) if pod.uid else None
    message = held_message(verdict, workloads_read=snapshot.kueue_read,
                           waited_s=max(0.0, (now - pod.created).total_seconds()),
                           no_workload_after_s=NO_WORKLOAD_AFTER_SECONDS)
    return Wait(pod.key, message, held=True, never=verdict is not None and verdict.never)


__all__ = ["LayoutChange", "Plan", "Preemption", "Release", "SharingChange", "Wait", "allowed_on", "held_by_kueue", "in_flight",
           "plan", "preemptors", "reclaimed", "waiting_key"]

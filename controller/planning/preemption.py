"""Preemption on the device-plugin pool: which running pods a waiting pod of higher priority displaces.

The planner (:mod:`controller.planning.planner`) asks here for a gated pod that fits nowhere: no
free capacity, none being created, none it may create now. The pod may preempt only when its
policy is not ``Never`` and only pods of strictly lower priority
(``sharing.rules.priority.may_preempt``, the one rule). Victims are gpupack's own pods bound or
pinned on one node of the device-plugin pool (never pods that are not gpupack's, never DRA pods:
the DRA pool is :mod:`controller.planning.draplan`'s).

**Whose choice.** A single-container shared pod or a whole-GPU pod gets the engine's plan,
``sharing.packing.preemption.engine_preemption``, the function the simulator calls
(:mod:`controller.planning.engine_victims` builds its state from the snapshot). That includes a
*reshape*, on the nodes whose policy gate is open now: every GPU pod of a node preempted (all of
lower priority) and the node switched for the preemptor (a shared node back to whole GPUs for a
whole-GPU pod; a node split anew at a one-replica pod's own size). A pod
that is not gpupack's (``nvidia.com/gpu`` asked by the pod itself, :attr:`Pod.plain`) that
kube-scheduler left Unschedulable after its own preemption found nothing preempts the same way;
it cannot be pinned, so its record names the node. A MIG pod and a shared pod of several containers,
which the engine's preemption does not model, are ranked here on the cycle's ledger
(:class:`controller.planning.capacity.FreeCapacity`), as the planner counts places: replicas
of the node's split (the node must already share by the pod's mode at a split the pod fits:
preemption never re-splits a node), instances of the profiles it asks for on a MIG node; and
its CPU and memory. A MIG pod for which no instance of its profiles can be freed may instead
preempt the pods holding instances on one MIG GPU whose policy gate is open, the fewest whose
instances, destroyed, leave room for its profiles (:mod:`controller.planning.mig_preemption`;
reason ``mig-reshape``): the planner holds the node for it and re-lays the GPU out once they are
gone. The victims of a node are taken lowest priority first, then least GPU
milli, until the shortfall is covered; among nodes the one with the fewest victims wins, then
the lowest highest-victim priority, then the least milli freed, then the snapshot's order: the
engine's own orders (:mod:`sharing.packing.victim_order`, one home for both) on the ledger's counts.

A preemptor carries the uids of its victims (``gpupack.io/preempting``, written with its pin in
one guarded patch, :mod:`controller.writes.preemption`). While one of them still exists it waits on
its node, its place held (:func:`still_held`); after that it waits on that node (it is pinned
there) until the node agent reports the place unused, and it never preempts again: no second pod
is killed for one preemptor. (It is planned first within its priority, so no older pod of its
priority takes the place meanwhile; a pod of higher priority may, as in kube-scheduler.) A victim
that is still running (the controller stopped between pinning the preemptor and deleting its
victims) is deleted again. A pod Kueue still holds never preempts: it is no demand.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from controller.planning.capacity import FreeCapacity
from controller.planning.engine_victims import engine_case, engine_plan
from controller.planning.mig_preemption import REASON_MIG_RESHAPE, reshape_victims
from controller.state.snapshot import Node, Pod, Snapshot
from sharing.packing.preemption import REASON_GPUS, REASON_REPLICA
from sharing.packing.victim_order import plan_key, victim_key
from sharing.rules.priority import may_preempt
from sharing.rules.replicas import fits_split


@dataclass(frozen=True)
class Victim:
    """A pod to preempt: its key and uid (the deletion's precondition), priority and GPU milli."""

    key: str
    uid: str
    priority: int
    milli: int


@dataclass(frozen=True)
class Preemption:
    """The plan's order to preempt ``victims`` on ``node`` for ``preemptor`` (its key)."""

    preemptor: str
    node: str
    victims: tuple[Victim, ...]
    reason: str
    kind: str = ""
    """What it frees (:func:`reason_for`): the ``reason`` label of ``gpupack_preemptions_total``."""
    resumed: bool = False
    """The victims were chosen by an earlier cycle and are still running: delete them again
    (not counted as a new preemption)."""
    plain: bool = False
    """The preemptor is not gpupack's (:attr:`Pod.plain`): it cannot be pinned; its record names the node."""
    gpu: int | None = None
    """The MIG GPU to re-lay out for the preemptor once the victims are gone (reason ``mig-reshape``)."""


@dataclass(frozen=True)
class Held:
    """A preemptor's victims that still exist: running ones (to delete again) and how many terminate."""

    running: tuple[Pod, ...]
    terminating: int

    @property
    def count(self) -> int:
        return len(self.running) + self.terminating


REASON_MIG = "mig-instance"
"""A MIG instance of the profile the preemptor asks for (the live planner's own case: the engine's
``sharing.packing.preemption`` reasons cover node-wide replicas and whole GPUs)."""


def reason_for(pod: Pod) -> str:
    """The metric reason of a preemption for ``pod``: the engine's words where they apply."""
    if pod.mode == "mig":
        return REASON_MIG
    return REASON_REPLICA if pod.shares > 0 else REASON_GPUS


def victim(pod: Pod) -> Victim:
    return Victim(pod.key, pod.uid, pod.priority.value, sum(pod.milli))


def still_held(pod: Pod, snapshot: Snapshot, running: dict[str, Pod]) -> Held | None:
    """The preemptor's victims that still exist (None when none does, or it preempted nothing).
    ``running``: the snapshot's pods by uid (terminating pods are not among them)."""
    if not pod.victims:
        return None
    alive = tuple(running[uid] for uid in pod.victims if uid in running)
    terminating = sum(1 for uid in pod.victims if uid not in running and uid in snapshot.present)
    return Held(alive, terminating) if alive or terminating else None


def resume(pod: Pod, held: Held) -> Preemption | None:
    """The deletions still to make for a preemptor whose victims run on (None: all terminate)."""
    if not held.running or pod.node is None:
        return None
    return Preemption(pod.key, pod.node, tuple(victim(v) for v in held.running),
                      f"finishing the preemption for {pod.key}", reason_for(pod), resumed=True, plain=pod.plain)


def _on_node(pods: Iterable[Pod]) -> dict[str, list[Pod]]:
    """The pods holding capacity per node: bound, or pinned with the gate lifted (the ledger's claims)."""
    out: dict[str, list[Pod]] = {}
    for pod in pods:
        if pod.node is not None and not pod.gated and pod.uid:
            out.setdefault(pod.node, []).append(pod)
    return out


def _covers(pod: Pod, node: Node, free: FreeCapacity, chosen: list[Pod]) -> bool:
    """Whether ``free`` on ``node`` plus what ``chosen`` hold gives ``pod`` its place."""
    if pod.shares > 0:
        return free.shared[node.name] + sum(v.shares for v in chosen) >= pod.shares
    if pod.mode == "mig":
        freed = free.mig_free(node.name) + Counter(p for v in chosen for p in v.profiles)
        return all(freed[p] >= n for p, n in Counter(pod.profiles).items())
    return free.whole[node.name] + sum(v.whole_gpus for v in chosen) >= pod.whole_gpus


def _helps(pod: Pod, candidate: Pod) -> bool:
    """Whether preempting ``candidate`` frees something of the kind ``pod`` needs."""
    if pod.shares > 0:
        return candidate.shares > 0
    if pod.mode == "mig":
        return candidate.mode == "mig" and bool(set(candidate.profiles) & set(pod.profiles))
    return candidate.whole_gpus > 0


def _room(pod: Pod, node: Node, free: FreeCapacity, chosen: list[Pod]) -> bool:
    """The pod's CPU and memory fit in what the node has left plus what the victims hold."""
    room = free.room.get(node.name)
    if room is None:
        return True
    cpu = room[0] + sum(v.cpu_milli for v in chosen)
    memory = room[1] + sum(v.memory_mib for v in chosen)
    return pod.cpu_milli <= cpu and pod.memory_mib <= memory


def _room_after(pod: Pod, free: FreeCapacity) -> Callable[[Node, list[Pod]], bool]:
    return lambda node, chosen: _room(pod, node, free, chosen)


def _place_kind_ok(pod: Pod, node: Node) -> bool:
    """The node holds places of the pod's kind as it is: preemption frees places, never re-splits."""
    if pod.shares > 0:
        return (node.sharing == pod.mode and node.converged
                and fits_split(node.replicas, pod.asks, node.gpu_memory_bytes))
    if pod.mode == "mig":
        return any(g.mig_enabled for g in node.gpus)
    return node.sharing == "none" and node.spec_sharing == "none"


def _victims_on(pod: Pod, node: Node, free: FreeCapacity, candidates: list[Pod]) -> list[Pod] | None:
    """The fewest lower-priority pods of ``node`` whose places give ``pod`` its place, lowest priority
    and least milli first; None when all of them would not."""
    chosen: list[Pod] = []
    for candidate in sorted(candidates, key=lambda v: victim_key(v.priority.value, sum(v.milli), v.key)):
        if _covers(pod, node, free, chosen) and _room(pod, node, free, chosen):
            break
        if _helps(pod, candidate) or not _room(pod, node, free, chosen):
            chosen.append(candidate)
    if chosen and _covers(pod, node, free, chosen) and _room(pod, node, free, chosen):
        return chosen
    return None


def _engine_choice(pod: Pod, nodes: Iterable[Node], free: FreeCapacity, pods: Iterable[Pod], *,
                   admits: Callable[[Node], bool], spared: set[str],
                   reclaim: Callable[[Node], bool] | None) -> Preemption | None:
    """``sharing.packing.preemption.engine_preemption``'s plan (:mod:`controller.planning.engine_victims`)."""
    listed = list(pods)
    found = engine_plan(pod, list(nodes), free, listed, admits=admits, spared=spared, reclaim=reclaim)
    if found is None:
        return None
    node, plan = found
    by_key = {p.key: p for p in listed}
    chosen = [by_key[v.key] for v in plan.victims]
    names = ", ".join(v.key for v in chosen)
    reason = (f"{pod.key} (priority {pod.priority.value}) fits nowhere; the engine preempts {names} "
              f"(priority {max(v.priority.value for v in chosen)} or lower) on {node.name}")
    return Preemption(pod.key, node.name, tuple(victim(v) for v in chosen), reason, plan.reason, plain=pod.plain)


def preferring_budgets(chooser: Callable[[set[str]], Preemption | None], spared: set[str],
                       protected: frozenset[str]) -> Preemption | None:
    """``chooser``'s preemption sparing the pods a PodDisruptionBudget protects, else one that may
    take them: kube-scheduler's preference (it prefers victims that violate no budget and still
    preempts when only those make room). ``spared``: pods never to take (chosen already this cycle)."""
    if protected:
        kept = chooser(spared | protected)
        if kept is not None:
            return kept
    return chooser(spared)


def choose(pod: Pod, nodes: Iterable[Node], free: FreeCapacity, pods: Iterable[Pod], *,
           admits: Callable[[Node], bool], spared: set[str],
           reclaim: Callable[[Node], bool] | None = None) -> Preemption | None:
    """The preemption that gives ``pod`` a place (see the module docstring), or None.

    ``nodes``: in the snapshot's order; ``admits``: whether the pod may go to a node (its terms,
    products and pin); ``spared``: keys of pods already chosen as victims this cycle; ``reclaim``:
    the nodes the policy gate lets be switched for the pod now: for the engine's pods, to be
    reshaped (:func:`controller.planning.engine_victims.engine_plan`); for a MIG pod, to have a GPU
    re-laid out (:mod:`controller.planning.mig_preemption`)."""
    if not (pod.gated or pod.plain) or not pod.priority.preempts or pod.victims or pod.queue_held:
        # A pod Kueue still holds is no demand: it never preempts (Kueue preempts for quota). A pod
        # preempts once: its victims gone, the place they held frees when the node agent reports
        # their devices unused (a process outlives its pod object by a poll or more), and planning
        # it again before then would kill a second pod for the same place.
        return None
    if engine_case(pod):
        return _engine_choice(pod, nodes, free, pods, admits=admits, spared=spared, reclaim=reclaim)
    nodes = list(nodes)
    by_node = _on_node(pods)
    best: tuple[tuple[int, int, int, int, int], Node, list[Pod]] | None = None
    for position, node in enumerate(nodes):
        if not _place_kind_ok(pod, node) or not admits(node):
            continue
        candidates = [v for v in by_node.get(node.name, ()) if v.key not in spared and v.backend != "dra"
                      and may_preempt(pod.priority, v.priority.value)]
        chosen = _victims_on(pod, node, free, candidates) if candidates else None
        if chosen is None:
            continue
        rank = (*plan_key([v.priority.value for v in chosen], sum(sum(v.milli) for v in chosen)), position)
        if best is None or rank < best[0]:
            best = (rank, node, chosen)
    if best is None:
        return _mig_reshape(pod, nodes, free, by_node, admits=admits, spared=spared, reclaim=reclaim)
    _, node, chosen = best
    names = ", ".join(v.key for v in chosen)
    reason = (f"{pod.key} (priority {pod.priority.value}) fits nowhere; preempting {names} "
              f"(priority {max(v.priority.value for v in chosen)} or lower) on {node.name}")
    return Preemption(pod.key, node.name, tuple(victim(v) for v in chosen), reason, reason_for(pod))


def _mig_reshape(pod: Pod, nodes: Iterable[Node], free: FreeCapacity, by_node: dict[str, list[Pod]], *,
                 admits: Callable[[Node], bool], spared: set[str],
                 reclaim: Callable[[Node], bool] | None) -> Preemption | None:
    """A MIG pod's preemption that frees instances on one GPU for it to be re-laid out
    (:mod:`controller.planning.mig_preemption`), on the nodes ``reclaim`` allows; None without one."""
    if pod.mode != "mig" or reclaim is None:
        return None
    found = reshape_victims(pod, nodes, by_node, admits=admits, may_reshape=reclaim, spared=spared,
                            room=_room_after(pod, free))
    if found is None:
        return None
    names = ", ".join(v.key for v in found.victims)
    reason = (f"{pod.key} (priority {pod.priority.value}) fits nowhere; preempting {names} "
              f"(priority {max(v.priority.value for v in found.victims)} or lower) on {found.node.name} "
              f"to re-lay out GPU {found.gpu} for {', '.join(sorted(pod.profiles))}")
    return Preemption(pod.key, found.node.name, tuple(victim(v) for v in found.victims), reason, REASON_MIG_RESHAPE,
                      gpu=found.gpu)


__all__ = ["REASON_MIG", "REASON_MIG_RESHAPE", "Held", "Preemption", "Victim", "choose", "preferring_budgets",
           "reason_for", "resume", "still_held", "victim"]

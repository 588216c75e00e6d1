"""Preemption for a MIG pod on the DRA pool: which lower-priority DRA pods' claims, lifted, give one
GPU room for the pod's profiles (issue 36).

``controller.planning.draplan`` asks here for a gated MIG pod (or a share whose MIG fallback failed
too) that fits nowhere. The rules are the device-plugin pool's
(:mod:`controller.planning.mig_preemption`): strictly lower priority
(``sharing.rules.priority.may_preempt``), never for ``preemptionPolicy: Never``, never a pod that
Kueue holds or that preempted already, victims on **one MIG GPU**, the fewest, by the same search
(:func:`~controller.planning.mig_preemption.fewest_victims`: subsets by size, then
``sharing.packing.victim_order``'s ranking), then the node's and GPU's order.

**Who holds what.** On the DRA pool the claims say it: a victim's claim holds MIG instances (or the
GPU whole) on the GPU; candidates are the node's DRA pods whose claims hold something there. Only the
victims' holds are lifted: an instance another claim holds, this cycle's promises, and faulted
instances stay where they are, so they are never counted as freed.

**The trial** is the engine's own choice (``sharing.dra.mig_choice`` through
``draplan._mig``, the caller's ``fits``) on the node's GPUs as this cycle sees them, with the
victims' holds lifted, in two readings of what the kubelet plugin leaves behind (docs/dra.md,
"Preparing, per device"):

1. the freed instances stay and are offered as themselves (an instance the plugin adopted stays at
   unprepare): the pod takes one of its profile (reason ``mig-instance``);
2. the freed instances are destroyed (the plugin destroys an instance it created; the agent destroys
   an idle one after ``idleSeconds`` where reshaping is allowed): their slices take a new placement,
   only where the node's policy lets the agent create that profile (``dramig.creation_rule``; reason
   ``mig-reshape``).

The victims' CPU and memory are not counted as freed (the DRA share path's conservative trial).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from controller.planning.dramig import mig_gpus
from controller.planning.mig_preemption import fewest_victims, lowest_first
from controller.state.dra_usage import Hold, claim_key
from controller.state.snapshot import Node, Pod
from mig.model import PlacedInstance
from sharing.dra.mig_choice import MigGpu
from sharing.rules.node_policy import NodePolicy

Trial = Callable[[list[MigGpu], Node], bool]
"""Whether the pod fits ``node`` given these GPUs of it (the engine's choice; commits to the copies)."""


@dataclass(frozen=True)
class DraMigVictims:
    """The victims on GPU ``gpu`` of ``node`` whose claims, lifted, give the preemptor its place."""

    node: Node
    gpu: int
    victims: tuple[Pod, ...]
    reshape: bool
    """The place needs the freed slices re-laid out (an instance created), not a freed instance as itself."""


def _full_size(instance: PlacedInstance, gpu: MigGpu) -> bool:
    """The instance the plugin gives a whole-GPU claim on a MIG GPU: every compute slice."""
    return gpu.model.profile(instance.profile).compute_slices == gpu.model.compute_slices


def lifted_gpus(node: Node, cycle: Sequence[MigGpu], on_node: Sequence[Hold], claims: set[str],
                policies: Mapping[str, NodePolicy], now: datetime, *, destroyed: bool,
                touched_only: bool = False) -> list[MigGpu]:
    """``node``'s MIG GPUs as ``cycle`` has them (copies) with the holds of ``claims`` lifted (``on_node``:
    the holds on ``node``): their instances offered as themselves, or, ``destroyed``, gone (module
    docstring). A GPU a lifted claim held whole comes back (it is absent from ``cycle``); a faulted
    instance stays taken. ``touched_only``: only the GPUs a lifted claim held (a pod of one profile that
    fits none of the node's GPUs now can only fit one of those)."""
    lifted = [h for h in on_node if h.claim in claims]
    whole = {h.device.gpu for h in lifted if h.device.kind == "gpu"}
    touched = {h.device.gpu for h in lifted}
    out = [g.copy() for g in cycle if g.node == node.name and (not touched_only or g.index in touched)]
    if whole:
        out += [g for g in mig_gpus([node], [h for h in on_node if h.claim not in claims], policies, now)
                if g.index in whole]
    reported = {g.index: g for g in node.gpus}
    for gpu in out:
        freed = {i for h in lifted if h.device.gpu == gpu.index
                 for i in [h.device.placed(node.model)] if i is not None}
        if gpu.index in whole:
            freed |= {i for i in gpu.spare if _full_size(i, gpu)}
        state = reported[gpu.index]
        for instance in sorted(freed):
            if instance in state.unhealthy_instances:
                continue
            if destroyed or instance not in state.instances:
                gpu.occupied = [i for i in gpu.occupied if i != instance]
                gpu.spare = [i for i in gpu.spare if i != instance]
            elif instance not in gpu.spare:
                gpu.spare = sorted([*gpu.spare, instance])
    return out


def dra_mig_victims(pod: Pod, profiles: tuple[str, ...], nodes: Iterable[Node], pods: Sequence[Pod],
                    cycle: Sequence[MigGpu], holds: Sequence[Hold], policies: Mapping[str, NodePolicy],
                    now: datetime, spared: set[str], fits: Trial) -> DraMigVictims | None:
    """The victims for MIG pod ``pod`` asking ``profiles`` (module docstring), or None. ``nodes``: the
    DRA pool in the snapshot's order; ``pods``: the pool's pods; ``cycle``: the MIG GPUs as this cycle
    has them; ``spared``: keys never to take; ``fits``: the engine's trial for ``profiles``."""
    if not pod.gated or not pod.priority.preempts or pod.victims or pod.queue_held:
        return None
    # The pod fits no GPU now: a pod of one profile can then only fit a GPU the victims free (the
    # trial need not look at the node's other GPUs, which is most of its cost on a large node).
    narrow = len(profiles) == 1
    holders: dict[str, list[Hold]] = {}
    by_node: dict[str, list[Hold]] = {}
    for hold in holds:
        holders.setdefault(hold.claim, []).append(hold)
        by_node.setdefault(hold.node, []).append(hold)
    best: tuple[tuple[int, int, int, int, int, int], DraMigVictims] | None = None
    for position, node in enumerate(nodes):
        if node.model is None:
            continue
        running = [v for v in pods if v.node == node.name and not v.gated and v.uid and v.claim
                   and v.key not in spared and v.key != pod.key]
        on_node = by_node.get(node.name, [])
        mine = [g for g in cycle if g.node == node.name]
        for gpu in node.gpus:
            if not gpu.mig_enabled or not gpu.healthy:
                continue
            on_gpu = [v for v in running if any(h.node == node.name and h.device.gpu == gpu.index
                                                and h.device.kind in ("mig", "gpu")
                                                for h in holders.get(claim_key(v), ()))]

            def trial(chosen: list[Pod], destroyed: bool = False, node: Node = node, mine: list[MigGpu] = mine,
                      on_node: list[Hold] = on_node) -> bool:
                claims = {claim_key(v) for v in chosen}
                return fits(lifted_gpus(node, mine, on_node, claims, policies, now, destroyed=destroyed,
                                        touched_only=narrow), node)

            # A GPU whose subsets cannot rank below the best so far cannot win: they go untried.
            found = fewest_victims(lowest_first(pod, on_gpu),
                                   lambda chosen: trial(chosen) or trial(chosen, destroyed=True),
                                   None if best is None else best[0][:4])
            if found is None:
                continue
            rank = (*found[0], position, gpu.index)
            if best is None or rank < best[0]:
                best = (rank, DraMigVictims(node, gpu.index, tuple(found[1]), not trial(found[1])))
    return None if best is None else best[1]


__all__ = ["DraMigVictims", "dra_mig_victims", "lifted_gpus"]
